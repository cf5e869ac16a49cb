//! What perftest prints: the header block, the address lines, the result tables, and the
//! `--out_json` file.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::oob::{BwReport, KeyLine};
use super::{Kind, Settings, Verb};

/// perftest's `RESULT_LINE`: 87 dashes.
pub(super) const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// `printf("%#0<width>x", value)`: zero-padded to `width` characters including the `0x`,
/// which C leaves out for zero.
pub(super) fn c_alt_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{:0width$x}", 0, width = width)
    } else {
        format!("{value:#0width$x}")
    }
}

/// The test's title, as `ctx_print_test_info` builds it: `RDMA_Write BW Test`,
/// `Atomic FETCH_AND_ADD Latency Test`, …
pub(super) fn title(s: &Settings) -> String {
    let mut t = String::from(match s.verb {
        Verb::Send => "Send",
        Verb::Write => "RDMA_Write",
        Verb::Read => "RDMA_Read",
        Verb::Atomic => "Atomic",
    });
    if s.verb == Verb::Atomic {
        t.push(' ');
        t.push_str(s.atomic.name());
    }
    t.push_str(match s.kind {
        Kind::Bw => " BW Test",
        Kind::Lat => " Latency Test",
    });
    t
}

/// The header block (`ctx_print_test_info`), closed by a `RESULT_LINE`.
pub(super) fn print_header(s: &Settings, mtu_bytes: u32) {
    println!("{RESULT_LINE}");
    println!("                    {}", title(s));
    println!(" Dual-port       : OFF\t\tDevice         : {}", s.device);
    println!(" Number of qps   : {}\t\tTransport type : IB", s.qps);
    println!(
        " Connection type : {}\t\tUsing SRQ      : {}",
        s.connection_name(),
        on_off(s.use_srq)
    );
    println!(" PCIe relax order: OFF");
    println!(" ibv_wr* API     : OFF");
    if s.is_client() {
        println!(" TX depth        : {}", s.tx_depth);
    }
    if s.verb == Verb::Send && !s.is_client() {
        println!(" RX depth        : {}", s.rx_depth);
    }
    if s.kind == Kind::Bw {
        println!(" CQ Moderation   : {}", s.cq_mod);
    }
    println!(" Mtu             : {mtu_bytes}[B]");
    println!(" Link type       : Ethernet");
    println!(" GID index       : {}", s.gid_index.unwrap_or(0));
    if matches!(s.verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {}", s.out_reads.unwrap_or(1));
    } else {
        println!(" Max inline data : 0[B]");
    }
    println!(" rdma_cm QPs\t : {}", on_off(s.rdma_cm));
    if s.rdma_cm {
        println!(" Data ex. method : rdma_cm");
        if !s.is_client() {
            println!("{RESULT_LINE}");
            println!(" Waiting for client rdma_cm QP to connect");
            println!(" Please run the same command with the IB/RoCE interface IP");
        }
    } else {
        println!(" Data ex. method : Ethernet");
    }
    println!("{RESULT_LINE}");
}

/// perftest's "ON" / "OFF".
fn on_off(on: bool) -> &'static str {
    if on {
        "ON"
    } else {
        "OFF"
    }
}

/// `ctx_print_pingpong_data`: the address line and the GID line, GID bytes in decimal.
pub(super) fn address_lines(side: &str, key: &KeyLine, verb: Verb) -> String {
    let mut line = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(key.lid.into(), 4),
        c_alt_hex(key.qpn.into(), 6),
        c_alt_hex(key.psn.into(), 6)
    );
    if verb == Verb::Read {
        line.push_str(&format!(" OUT {}", c_alt_hex(key.out_reads.into(), 4)));
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        line.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(key.rkey.into(), 8),
            c_alt_hex(key.vaddr, 16)
        ));
    }
    let gid: Vec<String> = key.gid.iter().map(|b| format!("{b:02}")).collect();
    format!("{line}\n GID: {}", gid.join(":"))
}

/// The bandwidth table's column line (`RESULT_FMT` / `RESULT_FMT_G`).
pub(super) fn bw_columns(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// One bandwidth result line (`REPORT_FMT`; `REPORT_FMT_EXT`'s extra digits for small Gb/s).
pub(super) fn bw_line(r: &BwReport, gbits: bool) -> String {
    if gbits && r.avg < 0.1 {
        format!(
            " {:<7}    {:<10}       {:<7.6}            {:<7.6}\t\t   {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    }
}

/// The latency table's column line (`RESULT_FMT_LAT`, or `RESULT_FMT_LAT_DUR` with `-D`).
pub(super) fn lat_columns(duration: bool) -> &'static str {
    if duration {
        " #bytes        #iterations       t_avg[usec]"
    } else {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
         t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    }
}

/// Latency results, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct LatReport {
    /// Message size.
    pub(super) size: u64,
    /// Iterations.
    pub(super) iters: u64,
    /// Smallest sample.
    pub(super) min: f64,
    /// Largest sample.
    pub(super) max: f64,
    /// The median (perftest's "typical").
    pub(super) typical: f64,
    /// The mean.
    pub(super) avg: f64,
    /// The standard deviation.
    pub(super) stdev: f64,
    /// The 99th percentile.
    pub(super) p99: f64,
    /// The 99.9th percentile.
    pub(super) p999: f64,
    /// Only the average is meaningful (`-D`).
    pub(super) duration: bool,
}

/// One latency result line (`REPORT_FMT_LAT` / `REPORT_FMT_LAT_DUR`).
pub(super) fn lat_line(r: &LatReport) -> String {
    if r.duration {
        return format!(" {:<7}       {:<10}        {:<7.2}", r.size, r.iters, r.avg);
    }
    format!(
        " {:<7} {:<10}    {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    )
}

/// Latency statistics from samples in nanoseconds (one round trip, or one operation),
/// divided by `factor` (2 for the ping-pong tests, whose samples are round trips).
pub(super) fn lat_report(size: u64, iters: u64, samples_ns: &[u64], factor: u64) -> LatReport {
    let mut sorted: Vec<f64> = samples_ns
        .iter()
        .map(|&ns| ns as f64 / factor as f64 / 1000.0)
        .collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return LatReport {
            size,
            iters,
            ..LatReport::default()
        };
    }
    // perftest's get_median.
    let typical = if (n - 1) % 2 == 1 {
        (sorted[n / 2] + sorted[n / 2 - 1]) / 2.0
    } else {
        sorted[n / 2]
    };
    let avg = sorted.iter().sum::<f64>() / n as f64;
    let stdev = (sorted.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64).sqrt();
    let mut histogram = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
        .expect("valid histogram bounds");
    for &ns in samples_ns {
        histogram.saturating_record((ns / factor).max(1));
    }
    // hdrhistogram answers with its bucket's top value: never above the largest sample.
    let max = sorted[n - 1];
    let quantile = |q: f64| (histogram.value_at_quantile(q) as f64 / 1000.0).min(max);
    LatReport {
        size,
        iters,
        min: sorted[0],
        max,
        typical,
        avg,
        stdev,
        p99: quantile(0.99),
        p999: quantile(0.999),
        duration: false,
    }
}

/// One result of the run, for the JSON file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Outcome {
    /// A bandwidth line.
    Bw(BwReport),
    /// A latency line.
    Lat(LatReport),
}

fn result_object(result: &Outcome) -> Value {
    match result {
        Outcome::Bw(r) => json!({
            "MsgSize": r.size,
            "n_iterations": r.iters,
            "BW_peak": round2(r.peak),
            "BW_average": round2(r.avg),
            "MsgRate": (r.msg_rate * 1e6).round() / 1e6,
        }),
        Outcome::Lat(r) if r.duration => json!({
            "MsgSize": r.size,
            "n_iterations": r.iters,
            "t_avg": round2(r.avg),
        }),
        Outcome::Lat(r) => json!({
            "MsgSize": r.size,
            "n_iterations": r.iters,
            "t_min": round2(r.min),
            "t_max": round2(r.max),
            "t_typical": round2(r.typical),
            "t_avg": round2(r.avg),
            "t_stdev": round2(r.stdev),
            "percentile_99": round2(r.p99),
            "percentile_99.9": round2(r.p999),
        }),
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Writes perftest's `--out_json` document: `test_info` (the header block's values) and
/// `results` (the last result line; `results_all` holds every line of an `-a` sweep).
pub(super) fn write_json(
    path: &Path,
    s: &Settings,
    mtu_bytes: u32,
    results: &[Outcome],
) -> Result<(), String> {
    let mut info = Map::new();
    info.insert("test".into(), title(s).replace(' ', "_").into());
    info.insert("Dual_port".into(), "OFF".into());
    info.insert("Device".into(), s.device.clone().into());
    info.insert("Number_of_qps".into(), s.qps.into());
    info.insert("Transport_type".into(), "IB".into());
    info.insert("Connection_type".into(), s.connection_name().into());
    info.insert("Using_SRQ".into(), on_off(s.use_srq).into());
    info.insert("PCIe_relax_order".into(), "OFF".into());
    info.insert("ibv_wr_API".into(), "OFF".into());
    if s.is_client() {
        info.insert("TX_depth".into(), s.tx_depth.into());
    }
    if s.verb == Verb::Send && !s.is_client() {
        info.insert("RX_depth".into(), s.rx_depth.into());
    }
    if s.kind == Kind::Bw {
        info.insert("CQ_Moderation".into(), s.cq_mod.into());
    }
    info.insert("Mtu".into(), mtu_bytes.into());
    info.insert("Link_type".into(), "Ethernet".into());
    info.insert("GID_index".into(), s.gid_index.unwrap_or(0).into());
    if matches!(s.verb, Verb::Read | Verb::Atomic) {
        info.insert("Outstand_reads".into(), s.out_reads.unwrap_or(1).into());
    } else {
        info.insert("Max_inline_data".into(), 0.into());
    }
    info.insert("rdma_cm_QPs".into(), on_off(s.rdma_cm).into());
    info.insert(
        "Data_ex_method".into(),
        if s.rdma_cm { "rdma_cm" } else { "Ethernet" }.into(),
    );
    write_doc(path, info, results, &[])
}

/// Writes a `--out_json` document from its `test_info` block and results; `extra` adds
/// fields to the `results` object.
pub(super) fn write_doc(
    path: &Path,
    info: Map<String, Value>,
    results: &[Outcome],
    extra: &[(&str, Value)],
) -> Result<(), String> {
    let mut doc = Map::new();
    doc.insert("test_info".into(), Value::Object(info));
    let mut last = results.last().map_or_else(|| json!({}), result_object);
    if let Value::Object(fields) = &mut last {
        for (key, value) in extra {
            fields.insert((*key).to_owned(), value.clone());
        }
    }
    doc.insert("results".into(), last);
    if results.len() > 1 {
        doc.insert(
            "results_all".into(),
            Value::Array(results.iter().map(result_object).collect()),
        );
    }
    let text = serde_json::to_string_pretty(&Value::Object(doc)).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n")
        .map_err(|e| format!("Couldn't write the JSON report {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_hex_formats_match_printf() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x35, 6), "0x0035");
        assert_eq!(c_alt_hex(0xb0f50e, 6), "0xb0f50e");
        assert_eq!(c_alt_hex(0x1acf, 8), "0x001acf");
        assert_eq!(c_alt_hex(0x55ba_7c2e_5000, 16), "0x0055ba7c2e5000");
        assert_eq!(c_alt_hex(0x80, 4), "0x80");
    }

    #[test]
    fn the_report_line_of_the_capture() {
        let r = BwReport {
            size: 4096,
            iters: 20,
            peak: 8.03,
            avg: 6.22,
            msg_rate: 0.001593,
        };
        assert_eq!(
            bw_line(&r, false),
            " 4096       20               8.03               6.22   \t\t   0.001593"
        );
    }

    #[test]
    fn the_address_lines_of_the_capture() {
        let key = KeyLine {
            lid: 0,
            out_reads: 1,
            qpn: 0x35,
            psn: 0xb0f50e,
            rkey: 0x1acf,
            vaddr: 0x55ba_7c2e_5000,
            gid: "::ffff:10.77.0.12"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            srqn: 0,
            gid_index: 0,
        };
        assert_eq!(
            address_lines("local", &key, Verb::Write),
            " local address: LID 0000 QPN 0x0035 PSN 0xb0f50e RKey 0x001acf VAddr 0x0055ba7c2e5000\n \
             GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:12"
        );
        assert_eq!(
            address_lines("remote", &key, Verb::Atomic),
            " remote address: LID 0000 QPN 0x0035 PSN 0xb0f50e\n \
             GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:12"
        );
    }

    #[test]
    fn latency_statistics() {
        let samples: Vec<u64> = (1..=100).map(|i| i * 2000).collect();
        let r = lat_report(2, 101, &samples, 2);
        assert!((r.min - 1.0).abs() < 1e-9);
        assert!((r.max - 100.0).abs() < 1e-9);
        assert!((r.typical - 50.5).abs() < 1e-9);
        assert!((r.avg - 50.5).abs() < 1e-9);
        assert!((r.p99 - 99.0).abs() < 0.1, "{}", r.p99);
    }
}
