//! Each process its own DPDK primary. Processes that share a device run
//! the same program with the same `UROCE_DPDK_EAL`, but two primaries
//! with one file prefix refuse each other ("Is another primary process
//! running?"), and `--in-memory` does not go with `--no-huge`. So the
//! prefix gets the process ID appended, the run-time directory it names
//! is removed at exit, and those of processes that died without removing
//! theirs are swept at the next start (their `config` file no longer
//! locked), and hugepage files are unlinked once mapped (`--huge-unlink`:
//! no prefix would take them back). Arguments that choose DPDK's own
//! multi-process mode
//! (`--proc-type`) or no shared files (`--in-memory`, `--no-shconf`) are
//! left as given.

use std::path::{Path, PathBuf};

/// `args` with a file prefix of this process's own (`pid`): the prefix
/// given (`uroce` if none) and `-<pid>`. Also the prefix given, for
/// [`sweep`]; `None` when the arguments are left as they are.
pub(super) fn own_prefix(args: &[String], pid: u32) -> (Vec<String>, Option<String>) {
    let keep = ["--proc-type", "--in-memory", "--no-shconf"];
    if args.iter().any(|a| keep.iter().any(|k| a == k || a.starts_with(&format!("{k}=")))) {
        return (args.to_vec(), None);
    }
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut base = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(p) = a.strip_prefix("--file-prefix=") {
            base = Some(p.to_string());
        } else if a == "--file-prefix" {
            base = it.next().cloned();
        } else {
            out.push(a.clone());
        }
    }
    let base = base.filter(|b| !b.is_empty()).unwrap_or_else(|| "uroce".into());
    out.push(format!("--file-prefix={base}-{pid}"));
    // Hugepage files are named by the prefix: with one per process none
    // would be taken back at the next start, so they are unlinked once
    // mapped (no secondary process needs them).
    let huge = !args.iter().any(|a| a == "--no-huge" || a.starts_with("--huge-unlink"));
    if huge {
        out.push("--huge-unlink".into());
    }
    (out, Some(base))
}

/// Whether `name` is a run-time directory [`own_prefix`] made of `base`.
fn is_own(name: &str, base: &str) -> bool {
    name.strip_prefix(base)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes the run-time directories beside `mine` that [`own_prefix`]
/// made of `base` for processes that are gone: no primary holds their
/// `config` file's lock (DPDK's `fcntl` lock on it, which ends with the
/// process however it ended), and the directory is over a minute old.
pub(super) fn sweep(mine: &Path, base: &str) {
    let Some(parent) = mine.parent() else { return };
    let Ok(dir) = std::fs::read_dir(parent) else { return };
    for e in dir.flatten() {
        let path = e.path();
        let name = e.file_name();
        if path == mine || !is_own(&name.to_string_lossy(), base) {
            continue;
        }
        // A primary starting locks its config a moment after making the
        // directory: a fresh one is left to its maker.
        let fresh = e.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|t| {
            t.elapsed().map_or(true, |age| age < std::time::Duration::from_secs(60))
        });
        if fresh {
            continue;
        }
        // The primary locks part of it (past the first bytes): any lock
        // in the file counts.
        let held = std::fs::File::open(path.join("config"))
            .is_ok_and(|f| crate::ofd_lock::any_held_by_other(&f));
        if !held {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The run-time directory to remove at exit (see [`own_prefix`]).
pub(super) static REMOVE_AT_EXIT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn each_process_gets_a_prefix_of_its_own() {
        let (a, base) = own_prefix(&strings(&["--no-huge", "--file-prefix=ns1", "-m", "64"]), 42);
        assert_eq!(a, strings(&["--no-huge", "-m", "64", "--file-prefix=ns1-42"]));
        assert_eq!(base.as_deref(), Some("ns1"));
        let (a, _) = own_prefix(&strings(&["--file-prefix", "x", "--no-pci"]), 7);
        assert_eq!(a, strings(&["--no-pci", "--file-prefix=x-7", "--huge-unlink"]));
        let (a, _) = own_prefix(&strings(&["--huge-unlink=never", "--no-pci"]), 7);
        assert_eq!(a, strings(&["--huge-unlink=never", "--no-pci", "--file-prefix=uroce-7"]));
        let (a, base) = own_prefix(&strings(&["--no-huge"]), 7);
        assert_eq!(
            (a, base.as_deref()),
            (strings(&["--no-huge", "--file-prefix=uroce-7"]), Some("uroce"))
        );
        for kept in
            [&["--proc-type=secondary"][..], &["--in-memory"], &["--no-shconf", "--file-prefix=y"]]
        {
            let given = strings(kept);
            assert_eq!(own_prefix(&given, 7), (given.clone(), None));
        }
        assert!(is_own("ns1-42", "ns1") && !is_own("ns1", "ns1") && !is_own("ns1-4x", "ns1"));
        assert!(!is_own("ns12-42", "ns1") && !is_own("ns1-", "ns1"));
    }

    /// A directory whose `config` a live process locks stays, as does a
    /// fresh one; an old one nobody locks (its process gone) and one
    /// without a config go; others' names are not touched.
    #[test]
    fn directories_of_gone_processes_are_swept() {
        let root = std::env::temp_dir().join(format!("uroce-eal-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["p-1", "p-2", "p-3", "p-4", "other-5", "p"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("config"), b"x").unwrap();
        }
        std::fs::remove_file(root.join("p-3").join("config")).unwrap();
        // All old but p-1's twin p-5, made just now (a primary starting).
        std::fs::create_dir_all(root.join("p-5")).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        for d in ["p-1", "p-2", "p-3", "p-4", "other-5", "p"] {
            std::fs::File::open(root.join(d)).unwrap().set_modified(old).unwrap();
        }
        // As DPDK locks it: a record lock, not at the file's start.
        let held = std::fs::OpenOptions::new().write(true).open(root.join("p-2/config")).unwrap();
        held.set_len(4096).unwrap();
        crate::ofd_lock::record_lock(&held, 1000).unwrap();
        sweep(&root.join("p-4"), "p");
        let left: Vec<bool> = ["p-1", "p-2", "p-3", "p-4", "other-5", "p"]
            .iter()
            .map(|d| root.join(d).exists())
            .collect();
        assert_eq!(left, [false, true, false, true, true, true]);
        drop(held);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
