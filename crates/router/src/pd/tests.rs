use super::*;

#[test]
fn server_info_roles_and_ports() {
    let info = br#"{"disaggregation_mode":"prefill","disaggregation_bootstrap_port":9101}"#;
    assert_eq!(
        advertised(info),
        Ok((Role::Prefill, BootstrapPort::Port(9101)))
    );
    let info = br#"{"disaggregation_mode":"decode","disaggregation_bootstrap_port":null}"#;
    assert_eq!(
        advertised(info),
        Ok((Role::Decode, BootstrapPort::Port(DEFAULT_BOOTSTRAP_PORT)))
    );
    let plain = br#"{"model_path":"m"}"#;
    assert_eq!(advertised(plain).map(|r| r.0), Ok(Role::Regular));
    assert_eq!(
        advertised(br#"{"disaggregation_mode":"null"}"#).map(|r| r.0),
        Ok(Role::Regular)
    );
    let e = advertised(br#"{"disaggregation_mode":"both"}"#).unwrap_err();
    assert!(
        e.contains("disaggregation_mode") && e.contains("\"both\""),
        "{e}"
    );
    let e =
        advertised(br#"{"disaggregation_mode":"prefill","disaggregation_bootstrap_port":70000}"#)
            .unwrap_err();
    assert!(
        e.contains("disaggregation_bootstrap_port") && e.contains("70000"),
        "{e}"
    );
    let e = advertised(br#"{"disaggregation_mode":3}"#).unwrap_err();
    assert!(e.contains("expected a string, got a number"), "{e}");
}

#[test]
fn the_command_line_wins_over_discovery() {
    let cfg = PdConfig {
        prefill: vec![
            ("http://p1:1".into(), Some(BootstrapPort::Port(7000))),
            ("http://p2:1".into(), Some(BootstrapPort::Omitted)),
            ("http://p3:1".into(), None),
        ],
        decode: vec!["http://d1:1".into()],
        ..Default::default()
    };
    let adv = Some((Role::Prefill, BootstrapPort::Port(9000)));
    assert_eq!(
        cfg.resolve("http://p1:1", adv),
        (Role::Prefill, BootstrapPort::Port(7000))
    );
    assert_eq!(
        cfg.resolve("http://p2:1", adv),
        (Role::Prefill, BootstrapPort::Omitted)
    );
    // No port on the command line: the advertised one.
    assert_eq!(
        cfg.resolve("http://p3:1", adv),
        (Role::Prefill, BootstrapPort::Port(9000))
    );
    // A decode URL stays decode whatever it advertises.
    assert_eq!(cfg.resolve("http://d1:1", adv).0, Role::Decode);
    // Anyone else: what it advertised.
    assert_eq!(
        cfg.resolve("http://x:1", adv),
        (Role::Prefill, BootstrapPort::Port(9000))
    );
    assert_eq!(cfg.resolve("http://y:1", None).0, Role::Regular);
    assert_eq!(role_of(None, "http://p1:1", None).0, Role::Regular);
}

#[test]
fn worker_pd_round_trips_and_shows_only_prefill_ports() {
    let w = WorkerPd::default();
    assert_eq!((w.role(), w.shown_port()), (Role::Regular, None));
    w.set(Role::Prefill, BootstrapPort::Port(8998));
    assert_eq!(
        (w.role(), w.port(), w.shown_port()),
        (Role::Prefill, BootstrapPort::Port(8998), Some(8998))
    );
    w.set(Role::Prefill, BootstrapPort::Omitted);
    assert_eq!((w.port(), w.shown_port()), (BootstrapPort::Omitted, None));
    w.set(Role::Decode, BootstrapPort::Port(1));
    assert_eq!((w.role(), w.shown_port()), (Role::Decode, None));
}

#[test]
fn rooms_are_63_bit_and_distinct() {
    let rooms: std::collections::HashSet<u64> = (0..10_000).map(|_| fresh_room()).collect();
    assert_eq!(rooms.len(), 10_000);
    assert!(rooms.iter().all(|r| *r < 1 << 63));
    // Not a counter: the top half of the range is used too.
    assert!(rooms.iter().any(|r| *r >= 1 << 62));
}

#[test]
fn a_decode_engines_transfer_queues_price_it_away() {
    use crate::book::{LoadSignal, Worker};
    use crate::fleet::FleetView;
    use crate::policy::{DecodeLoad, View};
    use loadlink_wire::LoadSnapshot;
    use loadlink_wire::snapshot::DisaggregationMetrics;
    use std::sync::Arc;
    let epoch = std::time::Instant::now();
    let ws: Vec<Arc<Worker>> = (0..2)
        .map(|i| Arc::new(Worker::new(format!("http://d{i}"), 1, None, epoch)))
        .collect();
    let snap = |prealloc: i64, transfer: i64| LoadSnapshot {
        num_running_reqs: 2,
        disaggregation: Some(DisaggregationMetrics {
            mode: "decode".into(),
            decode_prealloc_queue_reqs: prealloc,
            decode_transfer_queue_reqs: transfer,
            ..Default::default()
        }),
        ..Default::default()
    };
    ws[0].record(0, 0, &snap(3, 2));
    ws[1].record(0, 0, &snap(0, 0));
    let view = FleetView::new(&ws, LoadSignal::Backlog, 60_000);
    assert_eq!(
        (view.pending_transfers(0), view.pending_transfers(1)),
        (Some(5), Some(0))
    );
    let p = DecodeLoad::default();
    assert_eq!((p.cost(&view, 0), p.cost(&view, 1)), (7.0, 2.0));
    assert_eq!(p.pick(&view, 0), Some(1));
    // A prefill engine's own queues are its pending transfers; a regular engine has none.
    let prefill = DisaggregationMetrics {
        mode: "prefill".into(),
        prefill_bootstrap_queue_reqs: 1,
        prefill_inflight_queue_reqs: 4,
        decode_transfer_queue_reqs: 99,
        ..Default::default()
    };
    assert_eq!(metrics::pending_transfers(Some(&prefill)), 5);
    assert_eq!(metrics::pending_transfers(None), 0);
}
