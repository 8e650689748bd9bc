"""The MDS's per-op deltas (stampede.run.mds_counts.deltas) from two perf dumps, pure."""

from __future__ import annotations

from stampede.run.mds_counts import deltas


def dump(opens: int, open_s: float, lookups: int, revokes: int) -> dict[str, object]:
    return {"mds_server": {"req_open_latency": {"avgcount": opens, "sum": open_s, "avgtime": 0},
                           "req_lookup_latency": {"avgcount": lookups, "sum": 0.5, "avgtime": 0},
                           "handle_client_request": 99},
            "mds": {"request": opens + lookups, "reply": opens + lookups,
                    "ceph_cap_op_revoke": revokes, "ceph_cap_op_grant": 7}}


def test_requests_per_op_are_the_counts_moved_with_their_mean_latency() -> None:
    moved = deltas(dump(10, 1.0, 5, 2), dump(14, 1.002, 5, 6))
    # lookups did not move: not listed; 4 opens in 2 ms: 0.5 ms each
    assert moved["ops"] == {"open": {"requests": 4, "mean_ms": 0.5}}
    assert (moved["requests"], moved["replies"], moved["caps_revoked"], moved["caps_granted"]) \
        == (4, 4, 4, 0)


def test_an_op_the_first_dump_lacked_counts_from_zero() -> None:
    start = {"mds_server": {}, "mds": {}}
    moved = deltas(start, dump(0, 0.0, 3, 0))
    assert moved["ops"] == {"lookup": {"requests": 3, "mean_ms": 166.666667}}   # 0.5 s / 3


def test_an_mds_restarted_in_between_counts_from_its_restart() -> None:
    """A new MDS process's counters start at zero: no negative counts, the restart said."""
    moved = deltas(dump(100, 1.0, 50, 9), dump(2, 0.002, 1, 0))
    assert moved["ops"] == {"open": {"requests": 2, "mean_ms": 1.0},
                            "lookup": {"requests": 1, "mean_ms": 500.0}}
    assert moved["requests"] == 3 and "restarted" in moved
