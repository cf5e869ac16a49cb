//! Counters: every packet the engine sends, receives, drops or answers with a NAK is counted
//! under a name. Names that rxe has (`drivers/infiniband/sw/rxe/rxe_hw_counters.c`) are used as
//! they are, so `ferroce stat` reads like `rdma statistic show`; drops rxe does not count get
//! names of their own that say why.

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// The engine's counters. Each field's doc says what it counts.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            /// Every counter with its name, in a fixed order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    /// Packets sent (rxe).
    sent_pkts,
    /// Packets received, whatever became of them (rxe).
    rcvd_pkts,
    /// Requests with a PSN already processed: re-ACKed or replayed, not executed again (rxe).
    duplicate_request,
    /// Requests ahead of the expected PSN: answered with one sequence NAK, dropped (rxe).
    out_of_seq_request,
    /// Packets ahead of the PSN their queue pair expected, held until the rest of their
    /// receive batch was handled ([`crate::Engine::set_batch_holding`]): a receiving kernel's
    /// GRO may hand over one UDP flow's packets before another's. Counted once each, whatever
    /// became of them (most land in order; one still ahead is then handled as ever).
    held_ahead,
    /// RNR NAKs received by a requester (rxe).
    rcvd_rnr_err,
    /// RNR NAKs sent by a responder: a SEND arrived with no receive posted (rxe).
    send_rnr_err,
    /// PSN sequence NAKs received by a requester (rxe).
    rcvd_seq_err,
    /// Requests that gave up after `retry_cnt` retries (rxe).
    retry_exceeded_err,
    /// Requests that gave up after `rnr_retry` RNR retries (rxe).
    retry_rnr_exceeded_err,
    /// Retransmissions started by a timeout, a sequence NAK or an implied NAK (rxe).
    completer_retry_err,
    /// Go-back-N resends started early, a few measured round trips into a stall with nothing
    /// answered, before the ACK timeout (these spend no `retry_cnt`).
    early_resends,
    /// Early resends found needless: the answers that ended the stall covered packets the
    /// resend had not sent again (a slow peer or a lost ACK, not a lost packet).
    early_needless,
    /// Send windows narrowed because an ACK came after the ACK timer had run over a quarter
    /// of its timeout ([`crate::engine::QUEUE_CEILING_DIVISOR`]): the peer, serving other
    /// queue pairs or slow, let this one wait near its timeout. Nothing is resent for these.
    queue_narrowed,
    /// Early resends put off because the driver saw datagrams still unread on the way: in
    /// its own socket (the answer may be among them) or in a peer's on the same host (its
    /// process descheduled with the request in its queue). Nothing is resent for these.
    early_put_off,
    /// READ responses taken after a lost one, where their PSN puts them, instead of being
    /// dropped and asked for again.
    read_taken_ahead,
    /// READ requests that asked again for a run of lost responses only, between responses
    /// already taken (these spend no `retry_cnt`).
    read_reasks,
    /// Send work requests completed with an error (rxe).
    send_err,
    /// SEND messages completed by a requester (rxe).
    rdma_sends,
    /// SEND messages received into a receive request (rxe).
    rdma_recvs,
    /// RDMA WRITE messages received whole (RC and UC, with or without immediate): what an
    /// application watching its memory for a peer's bytes waits for.
    rdma_writes_rcvd,
    /// Datagrams that are not a well-formed RoCE packet.
    malformed_pkts,
    /// Packets whose ICRC did not match.
    icrc_err,
    /// IPv4 packets whose ICRC matched only with a non-zero IP ID, recovered from the ICRC
    /// (rxe and NICs send such IDs; a UDP socket cannot see them). 16 bits of the ICRC still
    /// checked the packet.
    icrc_id_recovered,
    /// Packets for a QP number that does not exist.
    unknown_qp,
    /// Packets whose opcode belongs to another transport than the QP's (UD on RC, say).
    opcode_err,
    /// Packets from an address other than the QP's peer.
    wrong_source,
    /// Packets with a partition key other than the default.
    pkey_err,
    /// Packets for a QP whose state does not process them (RESET, INIT, ERR, …).
    qp_state_drop,
    /// Congestion notification packets received (ignored, as rxe does).
    rcvd_cnp,
    /// Remote access error NAKs sent (key, range, protection domain or rights).
    resp_access_err,
    /// Invalid request NAKs sent (opcode sequence, length, unsupported operation).
    resp_invalid_req,
    /// Responses (ACKs, READ and atomic responses) that matched nothing outstanding.
    stale_response,
    /// UC messages abandoned: a PSN gap, an opcode out of sequence, a refused key or no
    /// receive request.
    uc_dropped_msgs,
    /// UC messages refused for their key, range or rights (RC answers these with a NAK,
    /// counted as `resp_access_err`).
    uc_access_err,
    /// WRITE packets an application's filter refused (a frame receiver's page bounds, say).
    write_filtered,
    /// Completions that did not fit in a full completion queue (the QP went to ERR).
    cq_overflow,
    /// UD datagrams whose Q_Key was not the receiving QP's: dropped (rxe's `qkey_viol`).
    qkey_err,
    /// UD datagrams that found no receive request posted: dropped (UD has no RNR).
    ud_no_recv,
    /// UD datagrams longer than the port's MTU: dropped.
    ud_too_long,
    /// UD datagrams longer than the receive request's buffer (header included): completed
    /// with a local length error.
    ud_len_err,
    /// Asynchronous events dropped, oldest first, because the application left more than
    /// `MAX_EVENTS` unread.
    events_dropped,
}
