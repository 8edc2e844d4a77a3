"""loadlink's sinks against SGLang's own readers, and SGLang's publisher against loadlink's reader."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import msgspec
import pytest
import zmq

from conftest import loadlink_bin, run_lines
from sglang_oracle import PARALLEL, load_publisher, load_snapshot as ls


def free_port_block(n: int) -> int:
    """A base port with n+1 consecutive free ports (checked by binding)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n + 1 >= 65535:
            continue
        ok = True
        for p in range(base, base + n + 1):
            with socket.socket() as t:
                try:
                    t.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def start_publisher(*args: str) -> subprocess.Popen:
    return subprocess.Popen([loadlink_bin(), "publish", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def recv_until(sock: zmq.Socket, n: int, timeout: float = 15.0) -> list[list[bytes]]:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        if sock.poll(100):
            out.append(sock.recv_multipart())
    assert len(out) == n, f"received {len(out)} of {n} messages"
    return out


@pytest.mark.parametrize("generation", ["snapshot", "loadstat"])
def test_sglang_decodes_our_pub_stream(generation):
    kv = free_port_block(5)
    proc = start_publisher(
        "--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}),
        "--load-publish-endpoint", "auto", "--generation", generation, "--dp-size", "2", "--cycle-hz", "200", "--duration", "20",
    )
    try:
        ctx = zmq.Context.instance()
        subs = []
        for rank in range(2):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.SUBSCRIBE, b"load" if generation == "loadstat" else b"")
            s.connect(f"tcp://127.0.0.1:{kv + 2 + rank}")
            subs.append(s)
        stat_dec = msgspec.msgpack.Decoder(load_publisher.LoadStat)
        for rank, s in enumerate(subs):
            msgs = recv_until(s, 3)
            seqs = [int.from_bytes(m[1], "big", signed=True) for m in msgs]
            assert all(len(m) == 3 and len(m[1]) == 8 for m in msgs)
            assert seqs == sorted(seqs) and len(set(seqs)) == 3
            for m in msgs:
                if generation == "snapshot":
                    assert m[0] == b""
                    snap = ls.snapshot_decoder.decode(m[2])
                    assert snap.dp_rank == rank and snap.max_running_requests == 64
                else:
                    assert m[0] == b"load"
                    stat = stat_dec.decode(m[2])
                    assert stat.attn_dp_rank == rank and stat.max_total_num_tokens == 100_000
            s.close(0)
    finally:
        proc.kill()
        proc.wait()


def test_we_decode_sglangs_real_publisher_in_order():
    kv = free_port_block(3)
    PARALLEL.num_dp_ranks = 1
    pub = load_publisher.SchedulerLoadPublisher(
        kv_events_config=json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}),
        load_publish_endpoint="auto",
        publish_interval=1,
    )
    assert pub.enable
    listener = subprocess.Popen(
        [loadlink_bin(), "wire", "listen", f"tcp://127.0.0.1:{kv + 1}", "--count", "20", "--timeout", "20"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        n, deadline = 0, time.monotonic() + 20
        while listener.poll() is None and time.monotonic() < deadline:
            n += 1
            snap = ls.LoadSnapshot(timestamp=time.time(), num_running_reqs=n, num_waiting_reqs=n % 5, num_used_tokens=10 * n, max_total_num_tokens=1000,
                                   token_usage=0.0, gen_throughput=0.0, cache_hit_rate=0.0, utilization=0.0)
            pub.publish_load_stat(lambda: snap)  # every value differs, so none is deduplicated
            time.sleep(0.005)
        out = listener.communicate(timeout=10)[0].splitlines()
    finally:
        listener.kill()
        pub.close()
    msgs = [json.loads(line) for line in out]
    assert len(msgs) == 20
    assert all(m["topic"] == "load" and m["payload"]["type"] == "LoadStat" for m in msgs)
    seqs = [m["seq"] for m in msgs]
    running = [m["payload"]["value"]["num_running_reqs"] for m in msgs]
    assert seqs == sorted(seqs) and running == sorted(running)
    assert all(m["payload"]["value"]["num_tokens"] == 10 * m["payload"]["value"]["num_running_reqs"] for m in msgs)


def test_sglang_shm_reader_reads_our_slots_and_we_read_sglangs(tmp_path):
    path = str(tmp_path / "loads.shm")
    snap = {"timestamp": 2.5, "dp_rank": 1, "num_waiting_reqs": 300, "token_usage": 0.0, "queues": {"waiting": 300, "grammar": 0, "paused": 1, "retracted": 2, "prealloc_ready": 3}}
    run_lines(["wire", "shm-write", path, "--dp-size", "3", "--rank", "1"], [json.dumps(snap)])
    reader = ls.ShmLoadSnapshotReader(path, 3)
    got = reader.read(1)
    reader.close()
    assert got.to_dict({"all"})["num_waiting_reqs"] == 300 and got.queues.retracted == 2 and got.timestamp == 2.5

    theirs = str(tmp_path / "theirs.shm")
    writer = ls.ShmLoadSnapshotWriter(theirs, 2, 1)
    s = ls.LoadSnapshot(timestamp=9.0, dp_rank=1, num_running_reqs=42, token_usage=0.75, lora=ls.LoRAMetrics(1, 4, 0.25))
    writer.write(s)
    writer.close()
    lines = [json.loads(x) for x in run_lines(["wire", "shm-read", theirs], [])]
    assert lines[0] is None  # rank 0 never written by anyone
    assert lines[1]["value"] == s.to_dict({"all"})


def test_no_torn_read_while_our_writer_runs(tmp_path):
    """SGLang's reader polls while `loadlink publish` rewrites the slot thousands of times a second."""
    path = str(tmp_path / "race.shm")
    kv = free_port_block(3)
    proc = start_publisher("--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}),
                           "--load-publish-endpoint", "off", "--shm-path", path, "--cycle-hz", "100000", "--duration", "60")
    try:
        # Generous bounds: on a loaded 2-core machine SGLang's reader often meets the slot mid-write
        # (it then returns None and is retried), so consistent reads come slower.
        deadline = time.monotonic() + 50
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        reader = ls.ShmLoadSnapshotReader(path, 1)
        reads, distinct = 0, set()
        # Read until both: 5,000 consistent reads, and the writer seen writing 100 distinct
        # snapshots meanwhile (a descheduled writer must not make the reads finish early).
        while (reads < 5_000 or len(distinct) <= 100) and time.monotonic() < deadline:
            s = reader.read(0)
            # None: met mid-write. Timestamp 0: the empty seed the writer puts in the slot when it
            # creates the file, before its first cycle (as SGLang's writer does); not a torn read.
            if s is None or s.timestamp == 0.0:
                continue
            reads += 1
            distinct.add((s.num_waiting_reqs, s.timestamp))
            # Internal consistency of every snapshot the synthetic source writes:
            # a torn slot would mix fields of two snapshots (or fail to decode).
            assert s.num_running_reqs == 32 + s.num_waiting_reqs // 2
            assert s.num_used_tokens == 40_000 + s.num_waiting_reqs * 1000
        reader.close()
        assert reads >= 5_000
        assert len(distinct) > 100, "the writer was really writing during the reads"
    finally:
        proc.kill()
        proc.wait()
