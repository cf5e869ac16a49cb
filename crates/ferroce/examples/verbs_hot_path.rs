//! The verbs backend's own cost per work request, for `scripts/bench-verbs-overhead.sh`:
//! `N` signaled one-entry SENDs posted one at a time and polled back (`single`), or posted in
//! chains of 16 (`post_send_list`) and polled in batches (`poll_into`; `chain`), on the device
//! named by the first argument (the stand-in `fake0`, whose provider functions do next to
//! nothing, so an instruction count of this program is ferroce's share of what a real
//! provider adds to).
//!
//! Usage: FERROCE_IBVERBS=path/to/libibverbs.so.1 verbs_hot_path DEVICE N single|chain

use ferroce::cq::{Completion, WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::Qpn;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{Cq, DeviceOptions, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

fn main() {
    let mut args = std::env::args().skip(1);
    let device = args.next().unwrap_or_else(|| "fake0".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let chain = args.next().as_deref() == Some("chain");
    let nic = Nic::open_device(&device, &DeviceOptions::default(), &NicConfig::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let cq = Cq::new(&nic, 64).unwrap();
    let caps = QpCaps {
        sq_depth: 32,
        rq_depth: 1,
        max_inline: 0,
    };
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, caps).unwrap();
    let region = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 4096]),
    )
    .unwrap();
    let sge = region.local(0, 64).unwrap();
    let send = |id: u64| SendWr::new(id, SendOp::Send, Payload::Sge(sge));
    let mut done = 0u64;
    for i in 0..if chain { 0 } else { n } {
        qp.post_send(send(i)).unwrap();
        while cq.poll().is_none() {}
        done += 1;
    }
    let mut out = [Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: Qpn::from_low_bits(0),
        ud: None,
    }; 16];
    for chunk in 0..if chain { n / 16 } else { 0 } {
        qp.post_send_list((0..16).map(|j| send(chunk * 16 + j)))
            .unwrap();
        let mut got = 0;
        while got < 16 {
            got += cq.poll_into(&mut out[got..]);
        }
        done += 16;
    }
    println!("{done} requests completed on {device}");
}
