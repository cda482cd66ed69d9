//! UNSAFE ISLAND (small): the `bpf(2)` calls the AF_XDP backend needs (an
//! XSKMAP, an XDP program, its attachment by a BPF link, a map update),
//! and the steering program itself, assembled here from its instructions:
//! no compiler, no object file, no libbpf, and no kernel BTF needed.
//!
//! The program sends UDP datagrams to the device's port (IPv4 without
//! options or fragments, IPv6 without extension headers) to the AF_XDP
//! socket of the queue they arrived on, and everything else (ARP,
//! neighbour discovery, ICMP, other ports, VLAN tags) to the kernel; with
//! no socket bound on a queue, `bpf_redirect_map` falls back to the kernel
//! too. On a device that other processes share, only the datagrams to
//! the QPNs of the program owner's slot go to its sockets: the others'
//! (and QPN 1's, which the group's CM steering places) go through the
//! kernel, whose socket group steers them by QPN. Attached through a BPF link, it is detached when the last
//! descriptor of the link closes, however the process ends.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE` / `XDP_FLAGS_DRV_MODE`.
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Insn {
    code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst | (src << 4), off, imm }
}

/// Registers: r0 result, r1 context, r2.. scratch, r6 saved context.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R5: u8 = 5;
const R6: u8 = 6;
const R7: u8 = 7;

/// A jump target, resolved when the program is finished.
#[derive(Debug, Clone, Copy)]
enum Label {
    Pass,
    Redirect,
}

/// The steering program being assembled: instructions, and jumps waiting
/// for their label's position.
#[derive(Default)]
struct Asm {
    code: Vec<Insn>,
    jumps: Vec<(usize, Label)>,
    labels: [Option<usize>; 2],
}

impl Asm {
    fn op(&mut self, i: Insn) {
        self.code.push(i);
    }
    fn mov_reg(&mut self, dst: u8, src: u8) {
        self.op(insn(0xbf, dst, src, 0, 0));
    }
    fn mov_imm(&mut self, dst: u8, imm: i32) {
        self.op(insn(0xb7, dst, 0, 0, imm));
    }
    fn add_imm(&mut self, dst: u8, imm: i32) {
        self.op(insn(0x07, dst, 0, 0, imm));
    }
    fn and_imm(&mut self, dst: u8, imm: i32) {
        self.op(insn(0x57, dst, 0, 0, imm));
    }
    fn rsh_imm(&mut self, dst: u8, imm: i32) {
        self.op(insn(0x77, dst, 0, 0, imm));
    }
    /// `dst = *(u32 / u16 / u8 *)(src + off)`.
    fn load(&mut self, bytes: u8, dst: u8, src: u8, off: i16) {
        let size = match bytes {
            4 => 0x00,
            2 => 0x08,
            _ => 0x10,
        };
        self.op(insn(0x61 | size, dst, src, off, 0));
    }
    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.jumps.push((self.code.len(), to));
        self.op(insn(code, dst, src, 0, imm));
    }
    /// `if dst != imm goto to`.
    fn jne(&mut self, dst: u8, imm: i32, to: Label) {
        self.jump(0x55, dst, 0, imm, to);
    }
    /// `if (u32)dst != (u32)imm goto to` (a 32-bit compare: a 64-bit one
    /// sign-extends the immediate).
    fn jne32(&mut self, dst: u8, imm: i32, to: Label) {
        self.jump(0x56, dst, 0, imm, to);
    }
    /// `if dst == imm goto to`.
    fn jeq(&mut self, dst: u8, imm: i32, to: Label) {
        self.jump(0x15, dst, 0, imm, to);
    }
    /// `if dst > src goto to` (unsigned).
    fn jgt_reg(&mut self, dst: u8, src: u8, to: Label) {
        self.jump(0x2d, dst, src, 0, to);
    }
    fn label(&mut self, l: Label) {
        self.labels[l as usize] = Some(self.code.len());
    }
    /// `if data + len > data_end goto pass` (r2 = data, r3 = data_end):
    /// what lets the verifier accept reads below `data + len`.
    fn need(&mut self, len: i32) {
        self.mov_reg(R4, R2);
        self.add_imm(R4, len);
        self.jgt_reg(R4, R3, Label::Pass);
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, l) in self.jumps {
            let to = self.labels[l as usize].expect("every label is placed");
            self.code[at].off = (to as isize - at as isize - 1) as i16;
        }
        self.code
    }
}

/// A little-endian load of two network-order bytes, as the program sees
/// a big-endian 16-bit field.
const fn be16(v: u16) -> i32 {
    v.swap_bytes() as i32
}

/// A little-endian load of four network-order bytes.
fn le32(b: [u8; 4]) -> i32 {
    i32::from_le_bytes(b)
}

/// The steering program for UDP port `port` of address `addr` (the
/// device's: datagrams to the interface's other addresses, another
/// device's or kernel rxe's, and to the device's other GIDs, which its
/// `udp` socket takes, go to the kernel), its XSKMAP referred to by
/// descriptor `map_fd` (patched in by the kernel at load). `slot`: the
/// owner's slot on a shared device (its QPNs only; QPN 1 to the kernel).
pub(crate) fn steering_program(
    port: u16,
    addr: IpAddr,
    map_fd: RawFd,
    slot: Option<u32>,
) -> Vec<Insn> {
    let mut a = Asm::default();
    a.mov_reg(R6, R1);
    a.load(4, R2, R6, 0); // data
    a.load(4, R3, R6, 4); // data_end
    match addr {
        IpAddr::V4(v4) => {
            // Ethernet (14) + IPv4 (20) + UDP (8).
            a.need(42);
            a.load(2, R5, R2, 12);
            a.jne(R5, be16(0x0800), Label::Pass);
            a.load(1, R5, R2, 23);
            a.jne(R5, 17, Label::Pass); // not UDP
            a.load(1, R5, R2, 14);
            a.and_imm(R5, 0x0f);
            a.jne(R5, 5, Label::Pass); // options: the kernel's
            a.load(2, R5, R2, 20);
            a.and_imm(R5, be16(0x3fff));
            a.jne(R5, 0, Label::Pass); // a fragment: the kernel reassembles
            a.load(2, R5, R2, 36);
            a.jne(R5, be16(port), Label::Pass);
            a.load(4, R5, R2, 30);
            a.jne32(R5, le32(v4.octets()), Label::Pass);
            a.mov_reg(R7, R2);
            a.add_imm(R7, 42);
        }
        IpAddr::V6(v6) => {
            // Ethernet (14) + IPv6 (40) + UDP (8).
            a.need(62);
            a.load(2, R5, R2, 12);
            a.jne(R5, be16(0x86dd), Label::Pass);
            a.load(1, R5, R2, 20);
            a.jne(R5, 17, Label::Pass); // not UDP, or an extension header
            a.load(2, R5, R2, 56);
            a.jne(R5, be16(port), Label::Pass);
            for (i, w) in v6.octets().chunks(4).enumerate() {
                a.load(4, R5, R2, 38 + 4 * i as i16);
                a.jne32(R5, le32([w[0], w[1], w[2], w[3]]), Label::Pass);
            }
            a.mov_reg(R7, R2);
            a.add_imm(R7, 62);
        }
    }
    // r7: the UDP payload, a BTH if RoCE.
    if let Some(slot) = slot {
        a.mov_reg(R4, R7);
        a.add_imm(R4, 8);
        a.jgt_reg(R4, R3, Label::Pass); // no BTH: the kernel's
        // The destination QPN's top byte; a slot is its top six bits.
        a.load(1, R5, R7, 5);
        a.rsh_imm(R5, (super::super::share::QPN_SHIFT - 16) as i32);
        a.jne(R5, slot as i32, Label::Pass);
        a.load(1, R5, R7, 5);
        a.jne(R5, 0, Label::Redirect);
        a.load(2, R5, R7, 6);
        a.jeq(R5, be16(1), Label::Pass); // QPN 1: the CM's
    }
    a.label(Label::Redirect);
    a.load(4, R2, R6, 16); // rx_queue_index
    // r1 = the map (a 16-byte load of the map's descriptor).
    a.op(insn(0x18, R1, 1, 0, map_fd));
    a.op(insn(0, 0, 0, 0, 0));
    a.mov_imm(R3, XDP_PASS); // no socket on the queue: to the kernel
    a.op(insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP));
    a.op(insn(0x95, 0, 0, 0, 0));
    a.label(Label::Pass);
    a.mov_imm(R0, XDP_PASS);
    a.op(insn(0x95, 0, 0, 0, 0));
    a.finish()
}

/// `bpf(cmd, attr)`, its result a new descriptor.
fn bpf_fd(cmd: libc::c_int, attr: &mut [u64; 16]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` (128 bytes) that
    // lives across the call; pointers in it point at live buffers.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr))
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// An XSKMAP of `entries` queues.
pub(crate) fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    // map_type, key_size, value_size, max_entries (u32 each).
    attr[0] = u64::from(BPF_MAP_TYPE_XSKMAP) | (4 << 32);
    attr[1] = 4 | (u64::from(entries) << 32);
    bpf_fd(BPF_MAP_CREATE, &mut attr)
}

/// `prog_flags`: the program handles frames in several buffers (it reads
/// only the headers, which are in the first); without it, native mode on
/// veth refuses an MTU above 3506 and frames longer than a page are
/// dropped.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;

/// Loads `prog` as an XDP program that takes multi-buffer frames, or a
/// plain one where the kernel does not know the flag; the verifier's log
/// goes into the error.
pub(crate) fn load_xdp(prog: &[Insn]) -> io::Result<OwnedFd> {
    load_xdp_with(prog, BPF_F_XDP_HAS_FRAGS).or_else(|e| match e.raw_os_error() {
        Some(libc::EINVAL) => load_xdp_with(prog, 0),
        _ => Err(e),
    })
}

fn load_xdp_with(prog: &[Insn], flags: u32) -> io::Result<OwnedFd> {
    let license = c"MIT OR Apache-2.0";
    let mut log = vec![0u8; 16384];
    let mut attr = [0u64; 16];
    // prog_type, insn_cnt (u32), insns (u64), license (u64), log_level,
    // log_size (u32), log_buf (u64).
    attr[0] = u64::from(BPF_PROG_TYPE_XDP) | ((prog.len() as u64) << 32);
    attr[1] = prog.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    attr[3] = 1 | ((log.len() as u64) << 32);
    attr[4] = log.as_mut_ptr() as u64;
    // kern_version (u32), prog_flags (u32).
    attr[5] = u64::from(flags) << 32;
    bpf_fd(BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        io::Error::new(e.kind(), format!("loading the XDP program: {e}; verifier: {text}"))
    })
}

/// Attaches XDP program `prog` to interface `ifindex` (`flags`: the
/// `XDP_FLAGS_*` mode). The returned link detaches it when closed.
pub(crate) fn attach_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    // prog_fd, target_ifindex, attach_type, flags (u32 each).
    attr[0] = prog.as_raw_fd() as u32 as u64 | (u64::from(ifindex) << 32);
    attr[1] = u64::from(BPF_XDP) | (u64::from(flags) << 32);
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// `map[key] = value` (both `u32`: a queue and an AF_XDP descriptor).
pub(crate) fn map_update(map: &OwnedFd, key: u32, value: u32) -> io::Result<()> {
    let mut attr = [0u64; 16];
    // map_fd (u32, padded), key (u64), value (u64), flags (u64).
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = (&raw const key) as u64;
    attr[2] = (&raw const value) as u64;
    // SAFETY: `attr` is a zero-padded `union bpf_attr`; key and value are
    // live `u32`s for the duration of the call.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, attr.as_mut_ptr(), size_of_val(&attr))
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_their_labels() {
        for addr in [ADDR, ADDR6] {
            for slot in [None, Some(5)] {
                jumps_land(&steering_program(4791, addr, 7, slot));
            }
        }
    }

    fn jumps_land(p: &[Insn]) {
        // Every jump stays inside the program, and the program ends with
        // `r0 = XDP_PASS; exit`.
        for (i, x) in p.iter().enumerate() {
            if matches!(x.code, 0x05 | 0x15 | 0x55 | 0x56 | 0x2d) {
                let to = i as isize + 1 + x.off as isize;
                assert!((0..p.len() as isize).contains(&to), "jump {i} leaves the program");
            }
        }
        assert_eq!(p[p.len() - 2], insn(0xb7, R0, 0, 0, XDP_PASS));
        assert_eq!(p[p.len() - 1].code, 0x95);
        // The port is compared in network order.
        assert!(p.iter().any(|x| x.code == 0x55 && x.imm == 0xb712));
    }

    /// What the program decides for `frame`: `Some(queue)` redirected to
    /// the socket of the queue, `None` passed to the kernel. A small
    /// interpreter of the instructions the assembler emits (the kernel's
    /// verifier and the veth tests check the real thing).
    fn verdict(p: &[Insn], frame: &[u8]) -> Option<u32> {
        const DATA: u64 = 0x1000;
        const CTX: u64 = 0x100;
        let mut r = [0u64; 11];
        r[1] = CTX;
        let load = |addr: u64, n: usize| -> u64 {
            let bytes: Vec<u8> = if (CTX..CTX + 24).contains(&addr) {
                let ctx = [DATA as u32, DATA as u32 + frame.len() as u32, 0, 0, 3, 0];
                ctx.iter()
                    .flat_map(|w| w.to_le_bytes())
                    .skip((addr - CTX) as usize)
                    .take(n)
                    .collect()
            } else {
                let at = (addr - DATA) as usize;
                assert!(at + n <= frame.len(), "a read past the frame: the bounds checks fail");
                frame[at..at + n].to_vec()
            };
            bytes.iter().rev().fold(0, |v, &b| v << 8 | u64::from(b))
        };
        let mut pc = 0usize;
        loop {
            let x = p[pc];
            let (dst, src) = (usize::from(x.regs & 0xf), usize::from(x.regs >> 4));
            let imm = x.imm as i64 as u64;
            pc += 1;
            let jump = |cond: bool, pc: &mut usize| {
                if cond {
                    *pc = (*pc as isize + x.off as isize) as usize;
                }
            };
            match x.code {
                0xbf => r[dst] = r[src],
                0xb7 => r[dst] = imm,
                0x07 => r[dst] = r[dst].wrapping_add(imm),
                0x57 => r[dst] &= imm,
                0x77 => r[dst] >>= imm,
                0x61 => r[dst] = load(r[src].wrapping_add(x.off as i64 as u64), 4),
                0x69 => r[dst] = load(r[src].wrapping_add(x.off as i64 as u64), 2),
                0x71 => r[dst] = load(r[src].wrapping_add(x.off as i64 as u64), 1),
                0x05 => jump(true, &mut pc),
                0x15 => jump(r[dst] == imm, &mut pc),
                0x55 => jump(r[dst] != imm, &mut pc),
                0x56 => jump(r[dst] as u32 != imm as u32, &mut pc),
                0x2d => jump(r[dst] > r[src], &mut pc),
                0x18 => pc += 1,
                0x85 => return Some(r[2] as u32),
                0x95 => return None,
                c => panic!("opcode {c:#x} not interpreted"),
            }
        }
    }

    const ADDR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 200));
    const ADDR6: IpAddr = IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xab, 0x8001));

    /// A UDP frame to `port` of `addr` carrying a BTH to `qpn` (or `len`
    /// payload bytes of it).
    fn frame_to(addr: IpAddr, port: u16, qpn: u32, len: usize) -> Vec<u8> {
        let (mut f, at) = match addr {
            IpAddr::V4(v4) => {
                let mut f = vec![0u8; 42 + 12];
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[23] = 17;
                f[30..34].copy_from_slice(&v4.octets());
                (f, 34)
            }
            IpAddr::V6(v6) => {
                let mut f = vec![0u8; 62 + 12];
                f[12..14].copy_from_slice(&[0x86, 0xdd]);
                f[14] = 0x60;
                f[20] = 17;
                f[38..54].copy_from_slice(&v6.octets());
                (f, 54)
            }
        };
        f[at + 2..at + 4].copy_from_slice(&port.to_be_bytes());
        f[at + 8 + 5..at + 8 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        f.truncate(at + 8 + len);
        f
    }

    fn frame(port: u16, qpn: u32, len: usize) -> Vec<u8> {
        frame_to(ADDR, port, qpn, len)
    }

    #[test]
    fn a_shared_devices_program_takes_only_its_slots_qpns() {
        let shift = crate::backend::share::QPN_SHIFT;
        let alone = steering_program(4791, ADDR, 7, None);
        let shared = steering_program(4791, ADDR, 7, Some(2));
        let mine = (2 << shift) | 0x123;
        assert_eq!(verdict(&alone, &frame(4791, 0x11, 12)), Some(3), "to the queue's socket");
        assert_eq!(verdict(&alone, &frame(4791, 1, 12)), Some(3), "the CM's too, alone");
        assert_eq!(verdict(&alone, &frame(4792, 0x11, 12)), None, "another port");
        assert_eq!(verdict(&shared, &frame(4791, mine, 12)), Some(3));
        assert_eq!(verdict(&shared, &frame(4791, (3 << shift) | 0x123, 12)), None, "slot 3's");
        assert_eq!(verdict(&shared, &frame(4791, 0x11, 12)), None, "slot 0's");
        assert_eq!(verdict(&shared, &frame(4791, 1, 12)), None, "the CM's: the group steers");
        assert_eq!(verdict(&shared, &frame(4791, mine, 7)), None, "no whole BTH");
        let slot0 = steering_program(4791, ADDR, 7, Some(0));
        assert_eq!(verdict(&slot0, &frame(4791, 0x11, 12)), Some(3));
        assert_eq!(verdict(&slot0, &frame(4791, 1, 12)), None, "QPN 1 is no slot's");
        assert_eq!(verdict(&slot0, &frame(4791, 0x101, 12)), Some(3));
        assert_eq!(verdict(&slot0, &frame(4791, 1 << shift, 12)), None);
    }

    #[test]
    fn only_the_devices_own_address_goes_to_its_sockets() {
        let other4: IpAddr = "10.0.0.201".parse().unwrap();
        let other6: IpAddr = "fd00::ab:8002".parse().unwrap();
        for slot in [None, Some(0)] {
            let v4 = steering_program(4791, ADDR, 7, slot);
            let v6 = steering_program(4791, ADDR6, 7, slot);
            assert_eq!(verdict(&v4, &frame_to(ADDR, 4791, 0x11, 12)), Some(3));
            assert_eq!(verdict(&v4, &frame_to(other4, 4791, 0x11, 12)), None, "another address");
            assert_eq!(verdict(&v4, &frame_to(ADDR6, 4791, 0x11, 12)), None, "IPv6: a GID's");
            assert_eq!(verdict(&v6, &frame_to(ADDR6, 4791, 0x11, 12)), Some(3));
            assert_eq!(verdict(&v6, &frame_to(other6, 4791, 0x11, 12)), None);
            assert_eq!(verdict(&v6, &frame_to(ADDR, 4791, 0x11, 12)), None);
        }
    }
}
