//! What several test binaries share.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferroce::device::{check_range, DeviceAllocator, DeviceError, DeviceMemory};
use ferroce::frames::{ImmediateLayout, Receiver, Target};
use ferroce::session::state::{Allocated, Connected, Established};
use ferroce::session::{
    ChannelDesc, ConnectInfo, Controller, Coprocessor, MemRegion, SessionError,
};

/// Device memory kept in host RAM, whose copies can be made to fail: what a GPU's would do,
/// without a GPU. (With the `cuda` feature and a GPU, the `cuda` module's tests and
/// `scripts/gpu-check.sh` run the real thing.)
#[derive(Debug)]
pub(crate) struct FakeDevice {
    pub(crate) bytes: Mutex<Vec<u8>>,
    writes: AtomicUsize,
    fail_from_write: usize,
}

impl FakeDevice {
    pub(crate) fn new(size: usize, fail_from_write: usize) -> Arc<Self> {
        Arc::new(Self {
            bytes: Mutex::new(vec![0; size]),
            writes: AtomicUsize::new(0),
            fail_from_write,
        })
    }

    /// A copy of `len` bytes at `offset`.
    pub(crate) fn bytes_at(&self, offset: usize, len: usize) -> Vec<u8> {
        self.bytes.lock().unwrap()[offset..offset + len].to_vec()
    }
}

impl DeviceMemory for FakeDevice {
    fn size(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }
    fn address(&self) -> u64 {
        0x7f00_0000_0000
    }
    fn describe(&self) -> String {
        "fake device 7".into()
    }
    fn write(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        check_range(self.size(), offset, src.len())?;
        if self.writes.fetch_add(1, Ordering::SeqCst) + 1 >= self.fail_from_write {
            return Err(DeviceError::Failed {
                device: self.describe(),
                operation: "copy to the device",
                reason: "an illegal address was encountered".into(),
            });
        }
        let at = offset as usize;
        self.bytes.lock().unwrap()[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self.size(), offset, dst.len())?;
        let at = offset as usize;
        dst.copy_from_slice(&self.bytes.lock().unwrap()[at..at + dst.len()]);
        Ok(())
    }
}

/// Allocates [`FakeDevice`]s for devices 0 to 7, and counts them.
#[derive(Debug, Default)]
pub(crate) struct FakeAllocator {
    pub(crate) allocations: AtomicUsize,
}

impl DeviceAllocator for FakeAllocator {
    fn alloc(&self, device: u32, size: usize) -> Result<Arc<dyn DeviceMemory>, DeviceError> {
        if device >= 8 {
            return Err(DeviceError::Unavailable(format!(
                "no fake device {device}: there are 8"
            )));
        }
        self.allocations.fetch_add(1, Ordering::SeqCst);
        Ok(FakeDevice::new(size, usize::MAX))
    }
}

/// The target a device would be programmed with for `rx`.
pub(crate) fn target(rx: &Receiver, payload: usize) -> Target {
    Target {
        dest: rx.local_addr().unwrap(),
        qp: rx.qp_number().unwrap(),
        rkey: rx.rkey().unwrap(),
        address: rx.external_frame_memory().unwrap(),
        page_size: rx.page_size(),
        pages: rx.pages(),
        frame_size: rx.frame_size(),
        payload,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    }
}

/// A controller connected with `info`, given its memory by `alloc`, keyed and established on
/// `desc`: every step a test does not look into.
pub(crate) fn established_controller(
    info: &ConnectInfo,
    desc: &ChannelDesc,
    alloc: impl FnOnce(
        Controller<Connected>,
    ) -> Result<(Controller<Allocated>, MemRegion), SessionError>,
) -> Result<(Controller<Established>, MemRegion), SessionError> {
    let (s, mem) = alloc(Controller::new().connect(info)?)?;
    let (s, peer) = s.exchange_keys(&mem)?;
    Ok((s.establish_channel(desc, &mem, &peer)?, mem))
}

/// The same for a coprocessor.
pub(crate) fn established_coprocessor(
    info: &ConnectInfo,
    desc: &ChannelDesc,
    alloc: impl FnOnce(
        Coprocessor<Connected>,
    ) -> Result<(Coprocessor<Allocated>, MemRegion), SessionError>,
) -> Result<(Coprocessor<Established>, MemRegion), SessionError> {
    let (s, mem) = alloc(Coprocessor::new().connect(info)?)?;
    let (s, peer) = s.exchange_keys(&mem)?;
    Ok((s.establish_channel(desc, &mem, &peer)?, mem))
}

/// A soft NIC on `ip`, port 4791: each test file takes addresses of its own, so the files can
/// run at once.
pub(crate) fn soft_nic(ip: std::net::Ipv4Addr) -> ferroce::Nic {
    ferroce::Nic::open(&ferroce::NicConfig {
        addr: std::net::SocketAddr::new(ip.into(), 4791),
        ..ferroce::NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

/// An RC QP on each of two NICs, connected to each other with the default options, each
/// with one CQ of `depth` for its sends and receives.
pub(crate) struct RcPair {
    pub(crate) qa: ferroce::Qp,
    pub(crate) qb: ferroce::Qp,
    pub(crate) cq_a: ferroce::Cq,
    pub(crate) cq_b: ferroce::Cq,
}

/// Builds an [`RcPair`] between `a` and `b`.
pub(crate) fn rc_pair(a: &ferroce::Nic, b: &ferroce::Nic, depth: usize) -> RcPair {
    use ferroce::qp::{QpCaps, QpType};
    use ferroce::{ConnectOptions, Cq, Qp};
    let (cq_a, cq_b) = (Cq::new(a, depth).unwrap(), Cq::new(b, depth).unwrap());
    let qa = Qp::new(a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qb = Qp::new(b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    RcPair { qa, qb, cq_a, cq_b }
}

/// `bytes` registered in RAM on `nic` with `access`, writes in order.
pub(crate) fn host_region(
    nic: &ferroce::Nic,
    access: ferroce::RegionAccess,
    bytes: Vec<u8>,
) -> ferroce::Region {
    ferroce::Region::register(
        nic,
        access,
        ferroce::proto::memory::WriteOrder::InOrder,
        ferroce::RegionMemory::Host(bytes),
    )
    .expect("register host memory")
}

/// A counter of `nic`'s statistics line (`Nic::statistics_line`), by name.
pub(crate) fn counter(nic: &ferroce::Nic, name: &str) -> u64 {
    let line = nic.statistics_line("ferroce0");
    let mut words = line.split(' ');
    words.find(|w| *w == name).expect("a counter of that name");
    words.next().unwrap().parse().unwrap()
}

/// The threads of this process named `name`, as far as the kernel keeps a thread's name (15
/// bytes): their IDs. A soft NIC's progress thread is "ferroce ADDR:PORT".
pub(crate) fn threads_named(name: &str) -> Vec<u32> {
    let kept = &name[..name.len().min(15)];
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (comm.trim_end() == kept)
                .then(|| task.file_name().to_str()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The fields of a thread's `/proc/self/task/TID/stat` line after its name: 0 is its state
/// (the line's field 3), 11 and 12 its user and system time in clock ticks, 16 its nice value.
/// Empty when the thread is gone.
pub(crate) fn thread_stat(tid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| {
        rest.split_whitespace().map(str::to_owned).collect()
    })
}
