"""`leads_with_quorum`: when a stream leader's answer can be believed (bridge/store_reads.py)."""

from __future__ import annotations

from nats.js import api

from bridge.store_reads import LEADER_CONTACT_S, StoreView, believable, leads_with_quorum

RECENT = int(0.5e9)
LONG_AGO = int((LEADER_CONTACT_S + 1) * 1e9)


def info(*replicas: api.PeerInfo, last_seq: int = 10) -> api.StreamInfo:
    cluster = api.ClusterInfo(leader="n0", replicas=list(replicas)) if replicas else None
    return api.StreamInfo(
        config=api.StreamConfig(name="KV_t"),
        state=api.StreamState(
            messages=1, bytes=1, first_seq=1, last_seq=last_seq, consumer_count=0
        ),
        cluster=cluster,
    )


def test_one_replica_has_no_election_to_lose() -> None:
    assert leads_with_quorum(info())


def test_a_leader_that_heard_one_of_two_followers_lately_has_its_quorum() -> None:
    heard = api.PeerInfo(name="n1", current=True, active=RECENT)
    silent = api.PeerInfo(name="n2", current=True, active=LONG_AGO)
    assert leads_with_quorum(info(heard, silent))


def test_a_leader_cut_off_from_both_followers_has_not() -> None:
    # What a cut-off leader reports: still "current", last heard from long ago.
    a = api.PeerInfo(name="n1", current=True, active=LONG_AGO)
    b = api.PeerInfo(name="n2", current=True, active=LONG_AGO)
    assert not leads_with_quorum(info(a, b))


def test_never_heard_and_offline_replicas_do_not_count() -> None:
    never = api.PeerInfo(name="n1", current=False, active=None)
    offline = api.PeerInfo(name="n2", current=False, offline=True, active=RECENT)
    assert not leads_with_quorum(info(never, offline))
    five = [api.PeerInfo(name=f"n{i}", active=RECENT if i < 2 else LONG_AGO) for i in range(4)]
    assert leads_with_quorum(info(*five))  # itself and two of four: 3 of 5
    five[1].active = LONG_AGO
    assert not leads_with_quorum(info(*five))


def test_an_answer_behind_what_was_seen_is_not_believed() -> None:
    view = StoreView()
    view.saw(12)
    assert not believable(info(last_seq=11), view)
    assert believable(info(last_seq=12), view)
