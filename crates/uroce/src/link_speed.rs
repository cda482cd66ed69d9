//! The port's width and speed, taken from the interface's Ethernet speed the
//! way Linux's `ib_get_eth_speed` does for rxe and RoCE NICs. Engines read
//! them (UCX turns width × speed into its bandwidth estimate and picks
//! transports by it), so a 10 Gb/s veth must not look like a 2.5 Gb/s
//! InfiniBand SDR link.

/// IB link width and speed in the encoding of `ibv_port_attr`
/// (`active_width`: 1 = 1X, 16 = 2X, 2 = 4X; `active_speed`: 1 = SDR,
/// 2 = DDR, 4 = QDR, 8 = FDR10, 16 = FDR, 32 = EDR, 64 = HDR, 128 = NDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpeed {
    /// `active_width`.
    pub width: u8,
    /// `active_speed`.
    pub speed: u8,
}

const W1X: u8 = 1;
const W2X: u8 = 16;
const W4X: u8 = 2;
const SDR: u8 = 1;
const DDR: u8 = 2;
const QDR: u8 = 4;
const FDR10: u8 = 8;
const FDR: u8 = 16;
const EDR: u8 = 32;
const HDR: u8 = 64;
const NDR: u8 = 128;

impl LinkSpeed {
    /// The width and speed the kernel reports for an Ethernet port of
    /// `mbps` Mb/s (`None`: unknown, as loopback's, which the kernel
    /// treats as 1 Gb/s). Interfaces that report no lane count, which is
    /// every software one, get the kernel's fixed table.
    pub fn for_ethernet(mbps: Option<u32>) -> Self {
        let (width, speed) = match mbps.unwrap_or(1000) {
            0..=1000 => (W1X, SDR),
            1001..=10_000 => (W1X, FDR10),
            10_001..=20_000 => (W4X, DDR),
            20_001..=25_000 => (W1X, EDR),
            25_001..=40_000 => (W4X, FDR10),
            40_001..=50_000 => (W2X, EDR),
            50_001..=100_000 => (W4X, EDR),
            100_001..=200_000 => (W4X, HDR),
            _ => (W4X, NDR),
        };
        Self { width, speed }
    }

    /// Lanes: 1, 2 or 4.
    pub fn lanes(self) -> u32 {
        match self.width {
            W2X => 2,
            W4X => 4,
            _ => 1,
        }
    }

    /// One lane's rate in tenths of Gb/s and the speed's name, as the
    /// kernel's sysfs `rate` file counts them.
    fn lane(self) -> (u32, &'static str) {
        match self.speed {
            DDR => (50, "DDR"),
            QDR => (100, "QDR"),
            FDR10 => (100, "FDR10"),
            FDR => (140, "FDR"),
            EDR => (250, "EDR"),
            HDR => (500, "HDR"),
            NDR => (1000, "NDR"),
            _ => (25, "SDR"),
        }
    }

    /// The sysfs `ports/1/rate` line: `10 Gb/sec (1X FDR10)`.
    pub fn rate(self) -> String {
        let (tenths, name) = self.lane();
        let total = tenths * self.lanes();
        let half = if total.is_multiple_of(10) { "" } else { ".5" };
        format!("{}{half} Gb/sec ({}X {name})", total / 10, self.lanes())
    }

    /// `ibv_devinfo -v`'s `active_width` value: `1X (1)`.
    pub fn width_str(self) -> String {
        format!("{}X ({})", self.lanes(), self.width)
    }

    /// `ibv_devinfo -v`'s `active_speed` value: `10.0 Gbps (8)`.
    pub fn speed_str(self) -> String {
        let gbps = match self.speed {
            DDR => "5.0",
            QDR | FDR10 => "10.0",
            FDR => "14.0",
            EDR => "25.0",
            HDR => "50.0",
            NDR => "100.0",
            _ => "2.5",
        };
        format!("{gbps} Gbps ({})", self.speed)
    }
}

/// The Ethernet speed of interface `ifname` in Mb/s, from sysfs (`None`
/// when the interface reports none: loopback, a link that is down).
pub(crate) fn interface_mbps(ifname: &str) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed")).ok()?;
    // A down link reads -1; unknown is SPEED_UNKNOWN (u32::MAX as -1 too).
    s.trim().parse::<i64>().ok().filter(|&v| v > 0).and_then(|v| u32::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::LinkSpeed;

    #[test]
    fn the_kernels_table_and_its_sysfs_spelling() {
        let cases = [
            (None, "2.5 Gb/sec (1X SDR)", "1X (1)", "2.5 Gbps (1)"),
            (Some(100), "2.5 Gb/sec (1X SDR)", "1X (1)", "2.5 Gbps (1)"),
            (Some(10_000), "10 Gb/sec (1X FDR10)", "1X (1)", "10.0 Gbps (8)"),
            (Some(20_000), "20 Gb/sec (4X DDR)", "4X (2)", "5.0 Gbps (2)"),
            (Some(25_000), "25 Gb/sec (1X EDR)", "1X (1)", "25.0 Gbps (32)"),
            (Some(40_000), "40 Gb/sec (4X FDR10)", "4X (2)", "10.0 Gbps (8)"),
            (Some(50_000), "50 Gb/sec (2X EDR)", "2X (16)", "25.0 Gbps (32)"),
            (Some(100_000), "100 Gb/sec (4X EDR)", "4X (2)", "25.0 Gbps (32)"),
            (Some(200_000), "200 Gb/sec (4X HDR)", "4X (2)", "50.0 Gbps (64)"),
            (Some(400_000), "400 Gb/sec (4X NDR)", "4X (2)", "100.0 Gbps (128)"),
        ];
        for (mbps, rate, width, speed) in cases {
            let l = LinkSpeed::for_ethernet(mbps);
            assert_eq!((l.rate().as_str(), l.width_str().as_str()), (rate, width), "{mbps:?}");
            assert_eq!(l.speed_str(), speed, "{mbps:?}");
        }
    }
}
