//! The out-of-band TCP channel and its key records.

use super::*;

/// One QP's key record (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Dest {
    pub(super) lid: u16,
    pub(super) out_reads: u16,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) rkey: u32,
    pub(super) vaddr: u64,
    pub(super) gid: [u8; 16],
    pub(super) srqn: u32,
}

impl Dest {
    pub(super) fn encode(&self) -> [u8; KEY_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            let _ = write!(s, "{b:02x}:");
        }
        let _ = write!(s, "{:08x}:", self.srqn);
        let mut m = [0u8; KEY_LEN];
        let n = s.len().min(KEY_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    pub(super) fn decode(m: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(m).unwrap_or("").trim_end_matches('\0');
        let f: Vec<&str> = text.split(':').collect();
        let bad = || {
            anyhow!(
                "Couldn't parse the peer's key record {text:?} (is it a perftest of the same test?)"
            )
        };
        if f.len() < 23 {
            return Err(bad());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(f[6 + i])? as u8;
        }
        Ok(Self {
            lid: hex(f[0])? as u16,
            out_reads: hex(f[1])? as u16,
            qpn: hex(f[2])? as u32,
            psn: hex(f[3])? as u32,
            rkey: hex(f[4])? as u32,
            vaddr: hex(f[5])?,
            gid,
            srqn: hex(f[22])? as u32,
        })
    }
}

/// The TCP side channel: the client writes first, the server reads first,
/// one write per message.
pub(super) struct Oob {
    pub(super) s: TcpStream,
    pub(super) client: bool,
}

impl Oob {
    pub(super) fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        if self.client {
            common::write_record(&mut self.s, mine)?;
            common::read_record(&mut self.s, theirs)
        } else {
            common::read_record(&mut self.s, theirs)?;
            common::write_record(&mut self.s, mine)
        }
    }

    /// One key-record handshake (`ctx_hand_shake`).
    pub(super) fn hs(&mut self, me: &Dest) -> Result<Dest> {
        let mut buf = [0u8; KEY_LEN];
        self.xchg(&me.encode(), &mut buf)?;
        Dest::decode(&buf)
    }

    /// Waits as long as the peer's traffic takes (no timeout; a dead peer
    /// closes the socket).
    pub(super) fn untimed(&self, on: bool) -> Result<()> {
        let t = if on { None } else { Some(common::OOB_TIMEOUT) };
        self.s.set_read_timeout(t)?;
        Ok(())
    }

    /// `ctx_close_connection`: a handshake, then "done\0" (never read).
    pub(super) fn close(&mut self, me: &Dest) -> Result<()> {
        self.untimed(true)?;
        self.hs(me)?;
        let _ = std::io::Write::write_all(&mut self.s, b"done\0");
        Ok(())
    }
}
