//! Where devices come from: no sysfs, just an environment variable or a
//! small file.
//!
//! - `UROCE_DEVICES`: a comma-separated list of `name=address[:port]` or
//!   plain `address[:port]` entries (IPv6 in brackets when a port follows:
//!   `[fd00::1]:4791`). Unnamed entries are called `uroce0`, `uroce1`, …
//!   in order.
//! - otherwise the file named by `UROCE_CONFIG`, else
//!   `$XDG_CONFIG_HOME/uroce/devices.conf` (or `~/.config/uroce/...`), else
//!   `/etc/uroce/devices.conf`: one device per line, `name address [port]`,
//!   `#` starts a comment.
//! - otherwise one device, `uroce0` on 127.0.0.1 port 4791.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use uroce_wire::udp::ROCE_V2_PORT;

/// One configured device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name (`uroce0`, …).
    pub name: String,
    /// The local IP address the device sends from and receives on.
    pub addr: IpAddr,
    /// UDP port (4791 unless overridden, e.g. for tests).
    pub port: u16,
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// An entry did not parse.
    #[error("{source_name}: bad device entry {entry:?}: {why}")]
    BadEntry {
        /// Where it came from.
        source_name: String,
        /// The entry.
        entry: String,
        /// What was wrong.
        why: &'static str,
    },
    /// Two devices have the same name.
    #[error("{0}: duplicate device name {1:?}")]
    Duplicate(String, String),
}

/// Parses `address[:port]`, IPv6 bracketed when a port is given.
fn parse_addr(s: &str) -> Option<(IpAddr, u16)> {
    if let Ok(a) = s.parse::<IpAddr>() {
        return Some((a, ROCE_V2_PORT));
    }
    s.parse::<SocketAddr>().ok().map(|sa| (sa.ip(), sa.port()))
}

/// Parses the `UROCE_DEVICES` syntax.
///
/// # Errors
/// [`ConfigError`] for a malformed entry or a duplicate name.
pub fn parse_env(value: &str) -> Result<Vec<DeviceConfig>, ConfigError> {
    let src = "UROCE_DEVICES".to_string();
    let mut out = Vec::new();
    for (i, entry) in value.split(',').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
        let (name, addr) = match entry.split_once('=') {
            Some((n, a)) => (n.trim().to_string(), a.trim()),
            None => (format!("uroce{i}"), entry),
        };
        let bad =
            |why| ConfigError::BadEntry { source_name: src.clone(), entry: entry.to_string(), why };
        if name.is_empty() || name.len() > 63 || name.contains(char::is_whitespace) {
            return Err(bad("bad device name"));
        }
        let (addr, port) =
            parse_addr(addr).ok_or_else(|| bad("expected an IP address, optionally with :port"))?;
        push(&mut out, &src, DeviceConfig { name, addr, port })?;
    }
    Ok(out)
}

/// Parses the file syntax.
///
/// # Errors
/// [`ConfigError`] for a malformed line or a duplicate name.
pub fn parse_file(source_name: &str, text: &str) -> Result<Vec<DeviceConfig>, ConfigError> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why| ConfigError::BadEntry {
            source_name: source_name.to_string(),
            entry: line.to_string(),
            why,
        };
        let mut f = line.split_whitespace();
        let (Some(name), Some(addr)) = (f.next(), f.next()) else {
            return Err(bad("expected: name address [port]"));
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("bad IP address"))?;
        let port = match f.next() {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None => ROCE_V2_PORT,
        };
        if f.next().is_some() {
            return Err(bad("trailing fields"));
        }
        push(&mut out, source_name, DeviceConfig { name: name.to_string(), addr, port })?;
    }
    Ok(out)
}

fn push(out: &mut Vec<DeviceConfig>, src: &str, d: DeviceConfig) -> Result<(), ConfigError> {
    if out.iter().any(|x| x.name == d.name) {
        return Err(ConfigError::Duplicate(src.to_string(), d.name));
    }
    out.push(d);
    Ok(())
}

fn config_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UROCE_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(p) = xdg.map(|d| d.join("uroce/devices.conf")).filter(|p| p.exists()) {
        return Some(p);
    }
    let etc = PathBuf::from("/etc/uroce/devices.conf");
    etc.exists().then_some(etc)
}

/// The devices of this process, from the environment, a file or the
/// default.
///
/// # Errors
/// [`ConfigError`] when the configuration is present but malformed.
pub fn load() -> Result<Vec<DeviceConfig>, ConfigError> {
    if let Ok(v) = std::env::var("UROCE_DEVICES")
        && !v.trim().is_empty()
    {
        return parse_env(&v);
    }
    if let Some(path) = config_file()
        && let Ok(text) = std::fs::read_to_string(&path)
    {
        return parse_file(&path.display().to_string(), &text);
    }
    Ok(vec![DeviceConfig {
        name: "uroce0".into(),
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: ROCE_V2_PORT,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_syntax() {
        let d = parse_env("127.0.0.2, b=10.0.0.1:5000,[::1]:4792, c=fe80::1").unwrap();
        assert_eq!(
            d[0],
            DeviceConfig { name: "uroce0".into(), addr: "127.0.0.2".parse().unwrap(), port: 4791 }
        );
        assert_eq!(d[1].name, "b");
        assert_eq!(d[1].port, 5000);
        assert_eq!((d[2].name.as_str(), d[2].port), ("uroce2", 4792));
        assert_eq!(d[3].addr, "fe80::1".parse::<IpAddr>().unwrap());
        assert!(parse_env("x=nonsense").is_err());
        assert!(matches!(parse_env("a=1.2.3.4,a=1.2.3.5"), Err(ConfigError::Duplicate(..))));
    }

    #[test]
    fn file_syntax() {
        let d = parse_file("t", "# devices\nuroce0 127.0.0.1\nuroce1 127.0.0.2 4800 # test\n\n")
            .unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].port, 4800);
        assert!(parse_file("t", "uroce0").is_err());
        assert!(parse_file("t", "uroce0 1.2.3.4 99999").is_err());
    }
}
