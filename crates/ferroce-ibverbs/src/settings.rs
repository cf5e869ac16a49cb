//! What the environment asks of the soft NIC besides its address (`addr`): faults injected on
//! every packet it sends (`FERROCE_FAULT`, as `ferroce`'s `--fault`), a pcap capture of every
//! packet sent and received (`FERROCE_PCAP`, as `--pcap`), and its counters on standard error
//! when it closes (`FERROCE_STATS`, the line `rdma statistic show` prints for rxe). They let an
//! unmodified program (perftest, UCX, a pingpong) run on the drop-in under loss, reordering
//! and duplication, and be watched in Wireshark, with no `tc netem`, no privileges and no
//! capture rights.
//!
//! Read once, when the process opens the soft NIC; a bad value fails `ibv_open_device` with
//! `EINVAL` and says what to write instead.

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use ferroce::{Faults, NicConfig};

/// Faults to inject: `loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N`.
pub(crate) const FAULT_ENV: &str = "FERROCE_FAULT";
/// The file to write the capture to (one per process: each opens its own NIC).
pub(crate) const PCAP_ENV: &str = "FERROCE_PCAP";
/// Print the NIC's counters on standard error when the process's last context closes.
pub(crate) const STATS_ENV: &str = "FERROCE_STATS";

/// The soft NIC's settings from the environment.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Settings {
    /// `FERROCE_FAULT`, parsed.
    pub(crate) faults: Option<Faults>,
    /// `FERROCE_PCAP`.
    pub(crate) pcap: Option<PathBuf>,
    /// `FERROCE_STATS` set to anything but empty or `0`.
    pub(crate) stats: bool,
}

/// A setting whose value cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadSetting {
    name: &'static str,
    reason: String,
}

impl fmt::Display for BadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.reason)
    }
}

impl Settings {
    /// The settings of this process's environment.
    pub(crate) fn from_env() -> Result<Self, BadSetting> {
        Self::from_values(
            std::env::var_os(FAULT_ENV),
            std::env::var_os(PCAP_ENV),
            std::env::var_os(STATS_ENV),
        )
    }

    /// The settings the three variables' values (unset: `None`) give. An empty value is
    /// unset, as a shell's `FERROCE_FAULT= program` means.
    pub(crate) fn from_values(
        fault: Option<OsString>,
        pcap: Option<OsString>,
        stats: Option<OsString>,
    ) -> Result<Self, BadSetting> {
        let set = |v: Option<OsString>| v.filter(|v| !v.is_empty());
        let faults = match set(fault) {
            None => None,
            Some(spec) => {
                let spec = spec.into_string().map_err(|v| BadSetting {
                    name: FAULT_ENV,
                    reason: format!("{v:?} is not UTF-8"),
                })?;
                Some(spec.parse::<Faults>().map_err(|e| BadSetting {
                    name: FAULT_ENV,
                    reason: e.to_string(),
                })?)
            }
        };
        let stats = match set(stats) {
            None => false,
            Some(v) if v == "0" => false,
            Some(v) if v == "1" => true,
            Some(v) => {
                return Err(BadSetting {
                    name: STATS_ENV,
                    reason: format!("{v:?} is neither 1 (print the counters at close) nor 0"),
                })
            }
        };
        Ok(Self {
            faults,
            pcap: set(pcap).map(PathBuf::from),
            stats,
        })
    }

    /// How to open the soft NIC on `ip` with these settings.
    pub(crate) fn config(&self, ip: IpAddr) -> NicConfig {
        NicConfig {
            faults: self.faults,
            pcap: self.pcap.clone(),
            ..NicConfig::on(ip)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    fn values(fault: &str, pcap: &str, stats: &str) -> Result<Settings, BadSetting> {
        let v = |s: &str| (!s.is_empty()).then(|| OsString::from(s));
        Settings::from_values(v(fault), v(pcap), v(stats))
    }

    #[test]
    fn unset_asks_for_nothing() {
        let s = values("", "", "").unwrap();
        assert_eq!(s, Settings::default());
        let config = s.config(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)));
        assert_eq!(
            config,
            NicConfig::on(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)))
        );
        // An empty value is unset, not an error.
        let empty = Settings::from_values(Some("".into()), Some("".into()), Some("".into()));
        assert_eq!(empty.unwrap(), Settings::default());
    }

    #[test]
    fn faults_capture_and_counters_reach_the_nic_config() {
        let s = values("loss=0.02,reorder=0.01,delay=5,seed=7", "/tmp/x.pcap", "1").unwrap();
        let faults = s.faults.expect("faults");
        assert_eq!(faults.loss, 0.02);
        assert_eq!(faults.reorder, 0.01);
        assert_eq!(faults.delay, Duration::from_micros(5));
        assert_eq!(faults.seed, 7);
        assert!(s.stats);
        let config = s.config(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(config.faults, Some(faults));
        assert_eq!(config.pcap, Some(PathBuf::from("/tmp/x.pcap")));
        assert!(config.gso && config.gro, "the rest stays the default");
        assert!(!values("", "", "0").unwrap().stats);
    }

    #[test]
    fn a_bad_value_names_the_variable_and_what_it_takes() {
        let e = values("loss=2", "", "").unwrap_err().to_string();
        assert!(e.starts_with("FERROCE_FAULT: "), "{e}");
        assert!(e.contains("not a probability"), "{e}");
        let e = values("drop=0.1", "", "").unwrap_err().to_string();
        assert!(e.contains("unknown fault"), "{e}");
        let e = values("", "", "yes").unwrap_err().to_string();
        assert!(e.starts_with("FERROCE_STATS: "), "{e}");
    }
}
