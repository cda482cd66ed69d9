//! With the `dpdk` feature: compiles the DPDK backend's C shim against the
//! installed DPDK (pkg-config's `libdpdk`) and links DPDK statically, with
//! only the ports the backend offers. Statically, because Debian's shared
//! DPDK loads every driver plugin at start, and its mlx4/mlx5 plugins
//! would bring the system's libibverbs into a process whose libibverbs is
//! ours. Without the feature: nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    dpdk::build();
}

#[cfg(feature = "dpdk")]
mod dpdk {
    use std::process::Command;

    /// Poll-mode drivers linked whole (they register themselves from
    /// constructors, which nothing else refers to).
    const WHOLE: [&str; 7] = [
        "rte_net_af_packet",
        "rte_net_af_xdp",
        "rte_net_tap",
        "rte_net_memif",
        "rte_net_null",
        "rte_bus_vdev",
        "rte_mempool_ring",
    ];
    /// The libraries they need, in link order.
    const LIBS: [&str; 12] = [
        "rte_gso",
        "rte_hash",
        "rte_rcu",
        "rte_ethdev",
        "rte_mbuf",
        "rte_mempool",
        "rte_ring",
        "rte_meter",
        "rte_net",
        "rte_kvargs",
        "rte_telemetry",
        "rte_eal",
    ];
    /// System libraries DPDK's static archives need.
    const SYSTEM: [&str; 9] = ["xdp", "bpf", "elf", "z", "numa", "bsd", "pthread", "dl", "m"];

    fn pkg_config(arg: &str) -> String {
        let out = Command::new("pkg-config").args([arg, "libdpdk"]).output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => panic!(
                "the `dpdk` feature needs DPDK's development files: \
                 `apt-get install libdpdk-dev pkg-config` (pkg-config found no libdpdk)"
            ),
        }
    }

    pub(super) fn build() {
        let shim = "src/backend/dpdk/shim.c";
        println!("cargo:rerun-if-changed={shim}");
        let cflags = pkg_config("--cflags");
        let libdir = pkg_config("--variable=libdir");
        let mut cc = cc::Build::new();
        cc.file(shim).warnings(true).flag_if_supported("-Wno-unused-parameter");
        for f in cflags.split_whitespace() {
            cc.flag(f);
        }
        cc.compile("uroce_dpdk_shim");
        println!("cargo:rustc-link-search=native={libdir}");
        for l in WHOLE {
            println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={l}");
        }
        for l in LIBS {
            println!("cargo:rustc-link-lib=static:-bundle={l}");
        }
        for l in SYSTEM {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
}
