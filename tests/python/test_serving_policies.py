"""Serving policies over gRPC: admission control, deadlines, prefix caching, logprobs, step-phase
metrics. Fixtures and options: conftest.py.

    /usr/bin/python3 -m pytest -q tests/python/test_serving_policies.py \
        --server-bin build/cpu/server/llm-server --model build/cpu/models/tiny-llama \
        --proto-python build/cpu/python
"""

import sys

import pytest

from conftest import HANG_S, PACED_LONG, PACED_MODEL


def greedy(pb, rid, ids, max_tokens, **kw):
    return pb.GenerateRequest(request_id=rid, token_ids=pb.TokenIds(ids=ids),
                              sampling=pb.SamplingParams(temperature=0.0),
                              stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True),
                              **kw)


@pytest.fixture(scope="module")
def tiny(module_server):
    return module_server(["--block-size", "16", "--num-kv-blocks", "128"])


def test_admission_control(server, grpc, pb):
    """One running sequence and a queue of two: the fourth concurrent request is refused at once
    with RESOURCE_EXHAUSTED. The paced model keeps the three holders running or waiting."""
    s = server(["--max-num-seqs", "1", "--max-queued-requests", "2",
                "--max-tokens-limit", str(PACED_LONG)], model=PACED_MODEL)
    stub = s.stub()
    streams = [stub.Generate(greedy(pb, "hold-0", [5, 6, 7, 8], PACED_LONG), timeout=HANG_S)]
    next(iter(streams[0]))  # hold-0 runs
    streams += [stub.Generate(greedy(pb, f"hold-{i}", [5, 6, 7, 8], PACED_LONG), timeout=HANG_S)
                for i in (1, 2)]
    s.wait_metrics(lambda m: m["llm_num_requests_waiting"] == 2,
                   "the two queued requests show as waiting")
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(greedy(pb, "overflow", [5, 6, 7, 8], 4), timeout=HANG_S))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    for st in streams:
        st.cancel()
    s.wait_idle()


def test_deadline(server, grpc, pb):
    """A request that cannot finish before its deadline ends with DEADLINE_EXCEEDED and its KV
    blocks are freed. PACED_LONG paced steps take minutes: longer than the 0.3 s deadline on any
    machine."""
    s = server(["--max-tokens-limit", str(PACED_LONG)], model=PACED_MODEL)
    stub = s.stub()
    it = iter(stub.Generate(greedy(pb, "deadline", [5, 6, 7, 8], PACED_LONG), timeout=0.3))
    with pytest.raises(grpc.RpcError) as e:
        list(it)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    s.wait_idle()


def test_prefix_cache(tiny, pb):
    """The same 100-token prompt twice: the repeat reports its full 16-token blocks as cached."""
    stub = tiny.stub()
    prompt = [(i * 7 + 3) % 700 for i in range(100)]
    hits0 = tiny.metrics()["llm_prefix_cache_hits_total"]
    usages = [list(stub.Generate(greedy(pb, rid, prompt, 4), timeout=HANG_S))[-1].complete.usage
              for rid in ("prefix-a", "prefix-b")]
    assert usages[0].cached_tokens == 0
    # Full blocks of the 100-token prompt, leaving at least one token to compute.
    assert usages[1].cached_tokens == 96
    assert tiny.metrics()["llm_prefix_cache_hits_total"] - hits0 >= 6
    tiny.wait_idle()


def test_logprobs(tiny, pb):
    """Chosen token plus top-N, sorted, the greedy choice on top."""
    stub = tiny.stub()
    msgs = list(stub.Generate(greedy(pb, "lp", [1, 2, 3], 5, logprobs=3), timeout=HANG_S))
    lps = [lp for msg in msgs if msg.HasField("chunk") for lp in msg.chunk.logprobs]
    lps += list(msgs[-1].complete.logprobs)
    ids = [t for msg in msgs[:-1] for t in msg.chunk.token_ids] + list(msgs[-1].complete.token_ids)
    assert len(ids) == 5 and [lp.token_id for lp in lps] == ids, "one logprob per token"
    for lp in lps:
        tops = [t.logprob for t in lp.top]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0, tops
        assert lp.top[0].token_id == lp.token_id
        assert lp.top[0].logprob == pytest.approx(lp.logprob, abs=1e-6)
    tiny.wait_idle()


def test_step_phase_metrics(tiny, pb):
    """Every non-empty step is observed once in each phase; the CPU has no graph or overlapped
    steps."""
    list(tiny.stub().Generate(greedy(pb, "phases", [1, 2, 3], 5), timeout=HANG_S))
    m = tiny.wait_idle()
    phases = ("schedule", "prepare", "forward", "sample")
    counts = [m[f"llm_engine_step_{p}_seconds_count"] for p in phases]
    assert len(set(counts)) == 1 and 0 < counts[0] <= m["llm_engine_steps_total"], counts
    assert m["llm_engine_step_forward_seconds_sum"] > 0
    assert m["llm_engine_graph_steps_total"] == 0
    assert m["llm_engine_overlapped_steps_total"] == 0


def test_sigterm_exit_code(tiny):
    """Last in the file: the shared server stops cleanly on SIGTERM."""
    assert tiny.terminate() == 0


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
