"""Many calls on one engine: answer_many keeps the requests' order and answers, aanswer bridges asyncio."""

from __future__ import annotations

import asyncio

import pytest

from qgpm import QGPM

from qgpm_testing import needle_context, NEEDLE_QUESTION, tiny_model


@pytest.fixture(scope="module")
def engine(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0), (2, 1)])


def test_answer_many_keeps_order_and_answers(engine):
    reqs = [dict(context=needle_context(w, n=20), question=NEEDLE_QUESTION, method=m, max_new_tokens=5)
            for w, m in ((2, "vanilla"), (9, "qgpm"), (15, "vanilla"), (4, "qgpm"))]
    one_by_one = [engine.answer(**r).text for r in reqs]
    assert [r.text for r in engine.answer_many(reqs, max_concurrency=3)] == one_by_one
    assert [r.method for r in engine.answer_many(reqs)] == [r["method"] for r in reqs]
    assert asyncio.run(engine.aanswer(**reqs[1])).text == one_by_one[1]


def test_bad_batches_fail_before_any_call(engine, monkeypatch):
    monkeypatch.setattr(engine, "answer", lambda **kw: (_ for _ in ()).throw(AssertionError("a call ran")))
    with pytest.raises(TypeError, match=r"request 1 has no 'context' \(its keys: \['question'\]\)"):
        engine.answer_many([{"context": "a", "question": "b"}, {"question": "b"}])
    with pytest.raises(TypeError, match=r"request 0 has no 'context' and no 'question' \(its keys: \['query'\]\)"):
        engine.answer_many([{"query": "b"}])
    with pytest.raises(TypeError, match="request 0 must be a dict with 'context' and 'question', got tuple"):
        engine.answer_many([("a", "b")])
    with pytest.raises(TypeError, match="list of dicts"):
        engine.answer_many({"context": "a", "question": "b"})
    with pytest.raises(ValueError, match="max_concurrency"):
        engine.answer_many([], max_concurrency=True)


@pytest.mark.parametrize("bad,exc,match", [
    (dict(method="bogus"), ValueError, "unknown method"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    (dict(foo=1), TypeError, "unexpected arguments"),
    (dict(question="  "), ValueError, "question"),
], ids=["method", "max_new_tokens", "unknown", "question"])
def test_a_bad_request_stops_the_batch_before_any_call(engine, monkeypatch, bad, exc, match):
    """Every request's arguments are checked as answer() checks them, before the first runs."""
    monkeypatch.setattr(engine, "answer", lambda **kw: (_ for _ in ()).throw(AssertionError("a call ran")))
    good = dict(context=needle_context(3, n=10), question=NEEDLE_QUESTION, max_new_tokens=4)
    with pytest.raises(exc, match=match) as info:
        engine.answer_many([good, good, {**good, **bad}])
    assert "in request 2 of answer_many()" in getattr(info.value, "__notes__", [])


def test_check_request_raises_as_answer_does_and_runs_nothing(engine, monkeypatch):
    monkeypatch.setattr("qgpm.preparing.build_prompt", lambda *a, **k: (_ for _ in ()).throw(AssertionError("prompt built")))
    engine.check_request(needle_context(3, n=10), NEEDLE_QUESTION, method="vanilla", max_new_tokens=4, top_k=3)
    with pytest.raises(TypeError, match="top_k must be an int"):
        engine.check_request(needle_context(3, n=10), NEEDLE_QUESTION, top_k="3")


def test_checks_in_other_threads_read_the_models_own_attention_while_a_baseline_runs(tokenizer):
    """A RoPE baseline's call switches the model's attention implementation while it holds the
    model lock; a call checked meanwhile in another thread sees the model's own (sdpa here)."""
    import threading

    from transformers import LogitsProcessor, LogitsProcessorList

    from qgpm import QGPMConfig

    engine = QGPM(tiny_model("llama", len(tokenizer), attn_implementation="sdpa"), tokenizer, heads=[(1, 0), (2, 1)])
    inside, release = threading.Event(), threading.Event()

    class Hold(LogitsProcessor):
        def __call__(self, input_ids, scores):
            inside.set()
            release.wait(30)
            return scores

    ctx = needle_context(3, n=60)  # long enough for STRING to change positions
    worker = threading.Thread(target=engine.answer, args=(ctx, NEEDLE_QUESTION),
                              kwargs=dict(method="string", max_new_tokens=2, logits_processor=LogitsProcessorList([Hold()])))
    worker.start()
    try:
        assert inside.wait(30)
        assert engine.model.config._attn_implementation != "sdpa"  # the baseline's, while it runs
        two_maps = QGPMConfig(relevance="heads", remap="reorder", split_layer=1, keep_length=0)  # needs the model's own masks
        engine.check_request(ctx, NEEDLE_QUESTION, config=two_maps)
        assert engine.prefill_reuse_on()
    finally:
        release.set()
        worker.join(30)
    assert engine.model.config._attn_implementation == "sdpa"


def test_a_failing_call_cancels_the_requests_not_started(engine, monkeypatch):
    """A failure while running (a server gone, say) stops the batch: the requests not started yet
    never run (no result is returned, their work would be lost); the first failed request's
    exception is raised, naming its index."""
    import threading
    import time

    from qgpm.serving import ServerUnreachableError

    ran, lock = [], threading.Lock()

    def answer(**kw):
        with lock:
            ran.append(kw["question"])
        if kw["question"] == "q1":
            raise ServerUnreachableError("no vLLM server answers")
        time.sleep(0.05)  # a call takes a while: the batch sees the failure before the pool drains the queue
        return kw["question"]

    monkeypatch.setattr(engine, "answer", answer)
    monkeypatch.setattr(engine, "check_request", lambda **kw: None)
    reqs = [dict(context="c", question=f"q{i}") for i in range(40)]
    with pytest.raises(ServerUnreachableError) as info:
        engine.answer_many(reqs, max_concurrency=2)
    assert "in request 1 of answer_many()" in info.value.__notes__
    assert len(ran) < 10, ran
    ran.clear()
    assert engine.answer_many(reqs[2:6], max_concurrency=2) == ["q2", "q3", "q4", "q5"]


def test_a_failing_call_stops_the_requests_waiting_for_the_local_model(engine):
    """On a model in this process every submitted request is already running for the pool, waiting
    for the model's lock: after one fails, none of those waiting starts to generate."""
    import time

    from transformers import LogitsProcessor, LogitsProcessorList

    started, failed_at = {}, []

    class Step(LogitsProcessor):
        def __init__(self, i):
            self.i = i

        def __call__(self, input_ids, scores):
            if self.i == 0:
                failed_at.append(time.perf_counter())
                raise RuntimeError("a processor that fails")
            started.setdefault(self.i, time.perf_counter())
            return scores

    reqs = [dict(context=needle_context(3, n=20), question=NEEDLE_QUESTION, method="vanilla", max_new_tokens=30,
                 logits_processor=LogitsProcessorList([Step(i)])) for i in range(6)]
    with pytest.raises(RuntimeError, match="a processor that fails") as info:
        engine.answer_many(reqs, max_concurrency=8)
    assert "in request 0 of answer_many()" in info.value.__notes__
    after = sorted(i for i, t in started.items() if t > failed_at[0])
    assert not after, f"requests {after} started to generate after request 0 failed"
    assert [r.text for r in engine.answer_many([dict(r, logits_processor=None) for r in reqs[1:3]])] == \
        [engine.answer(**dict(reqs[1], logits_processor=None)).text] * 2  # the engine answers as before


def test_cancelling_aanswer_stops_the_generation(engine):
    """A caller that gives up (a client disconnecting, asyncio.wait_for) stops the call: the
    model's forwards stop soon after, instead of running to max_new_tokens in a thread nobody
    waits for."""
    import time

    from qgpm.runtime import decoder_layers

    forwards = []

    def slow(*args):
        forwards.append(1)
        time.sleep(0.01)

    hook = decoder_layers(engine.model)[0].register_forward_pre_hook(slow)
    try:
        async def give_up():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(engine.aanswer(needle_context(3, n=20), NEEDLE_QUESTION, method="vanilla", max_new_tokens=300,
                                                      min_new_tokens=300), 0.5)
        asyncio.run(give_up())
        after = len(forwards)
        time.sleep(0.5)
        assert len(forwards) == after and after < 150, after
    finally:
        hook.remove()
    assert engine.answer(needle_context(3, n=20), NEEDLE_QUESTION, method="vanilla", max_new_tokens=2).usage.answer_tokens > 0


def test_many_aanswer_calls_wait_at_once_beyond_the_default_executor():
    """The asyncio bridge has its own threads: 16 calls blocked on a (remote) generation are all
    in flight together, where the event loop's default executor gives cpu_count() + 4 threads."""
    import threading
    import time

    from qgpm.batching import aanswer

    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Stream:
        result = "done"

        def __iter__(self):
            return self

        def __next__(self):
            if getattr(self, "done", False):
                raise StopIteration
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(0.3)
            with lock:
                state["now"] -= 1
            self.done = True
            return "piece"

    class Engine:
        def stream(self, context, question, **kw):
            return Stream()

    async def run():
        return await asyncio.gather(*[aanswer(Engine(), "c", "q") for _ in range(16)])

    assert asyncio.run(run()) == ["done"] * 16
    assert state["most"] == 16


@pytest.mark.parametrize("method", ["vanilla", "qgpm"])  # waiting for pass 2's prefill / for pass 1 over the heads
def test_a_call_closed_while_it_waits_for_the_model_runs_nothing(engine, method):
    """A stream closed (a client gone, a timeout) while another call holds the model gives up
    its turn: it returns without waiting for that call and runs no forward of its own; through
    aanswer, a cancelled task returns while the model is still held."""
    import threading
    import time

    from qgpm.runtime import decoder_layers, model_lock

    forwards = []
    hook = decoder_layers(engine.model)[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    lock = model_lock(engine.model)
    lock.acquire()  # another call's turn
    try:
        stream = engine.stream(needle_context(3, n=20), NEEDLE_QUESTION, method=method, max_new_tokens=4)
        got = []
        reader = threading.Thread(target=lambda: got.extend(stream))
        reader.start()
        time.sleep(0.3)
        stream.cancel()
        reader.join(timeout=10)
        assert not reader.is_alive() and got == [] and stream.result is None

        async def give_up():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(engine.aanswer(needle_context(3, n=20), NEEDLE_QUESTION, method=method, max_new_tokens=4), 0.3)
        done = threading.Thread(target=lambda: asyncio.run(give_up()))
        done.start()
        done.join(timeout=10)
        assert not done.is_alive()  # the task ended while the model was still held
        assert forwards == []
    finally:
        lock.release()
    try:
        assert engine.answer(needle_context(3, n=20), NEEDLE_QUESTION, method=method, max_new_tokens=2).usage.answer_tokens > 0
        assert forwards  # the hook counts a call's forwards
    finally:
        hook.remove()


def test_a_cancelled_task_is_signalled_even_when_every_bridge_thread_is_busy(engine, monkeypatch):
    """The cancel reaches a call waiting for the model from the event loop itself: with the
    bridge's one thread blocked in that call's step, the task still ends while the model is held."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import qgpm.batching
    from qgpm.runtime import model_lock

    monkeypatch.setattr(qgpm.batching, "_POOL", ThreadPoolExecutor(max_workers=1))
    lock = model_lock(engine.model)
    lock.acquire()
    try:
        async def give_up():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(engine.aanswer(needle_context(3, n=20), NEEDLE_QUESTION, method="vanilla", max_new_tokens=4), 0.3)
        done = threading.Thread(target=lambda: asyncio.run(give_up()))
        done.start()
        done.join(timeout=10)
        assert not done.is_alive()
    finally:
        lock.release()


def test_a_failure_under_the_model_lock_is_reported_before_the_lock_is_let_go(engine):
    """cancelled_by(on_failure=...) runs while the failing call still holds the model, so a call
    waiting behind it cannot take its turn between the failure and the report."""
    import threading

    from qgpm.runtime import cancelled_by, model_lock, model_turn

    seen = []

    def try_lock():
        lock = model_lock(engine.model)
        seen.append(lock.acquire(timeout=0.2))
        if seen[-1]:
            lock.release()

    def report():  # the lock is re-entrant: probe it from another thread
        probe = threading.Thread(target=try_lock)
        probe.start()
        probe.join()

    with pytest.raises(RuntimeError, match="boom"):
        with cancelled_by(lambda: False, on_failure=report), model_turn(engine.model):
            raise RuntimeError("boom")
    assert seen == [False]  # another thread could not take the model while the failure was reported
    with model_turn(engine.model):  # and the lock is free again
        pass


@pytest.mark.parametrize("method", ["vanilla", "qgpm"])
def test_check_request_refuses_a_prompt_that_only_its_template_pushes_past_the_window(tokenizer, method):
    """A context whose own tokens fit the window but whose whole prompt (instruction, chat markers,
    question) does not is refused by check_request, with answer's message, and by answer_many
    before any call runs; one token less of budget than the window allows still passes."""
    from qgpm import ContextTooLongError
    from qgpm.prompt import PromptSpec, count_prompt_tokens, normalize_spec

    engine = QGPM(tiny_model("llama", len(tokenizer), max_position_embeddings=512), tokenizer, heads=[(1, 0), (2, 1)])
    filler = "The depot opens at six and closes at nine. "

    def prompt_size(n):
        return count_prompt_tokens(tokenizer, normalize_spec(PromptSpec(context=filler * n, question=NEEDLE_QUESTION)))

    n = 1
    while prompt_size(n) + 8 <= 512:
        n += 1
    context, prompt_tokens = filler * n, prompt_size(n)  # the first context whose whole prompt and budget pass 512
    assert len(tokenizer(context, add_special_tokens=False)["input_ids"]) + 8 < 512  # its own tokens fit
    with pytest.raises(ContextTooLongError) as checked:
        engine.check_request(context, NEEDLE_QUESTION, method=method, max_new_tokens=8)
    with pytest.raises(ContextTooLongError) as answered:
        engine.answer(context, NEEDLE_QUESTION, method=method, max_new_tokens=8)
    assert f"the prompt is {prompt_tokens} tokens" in str(checked.value) and f"the prompt is {prompt_tokens} tokens" in str(answered.value)
    ran = []
    engine.model.register_forward_hook(lambda *a: ran.append(1))
    with pytest.raises(ContextTooLongError):
        engine.answer_many([dict(context="Short.", question=NEEDLE_QUESTION, method=method, max_new_tokens=8),
                            dict(context=context, question=NEEDLE_QUESTION, method=method, max_new_tokens=8)])
    assert ran == []
    shorter, budget = filler * (n - 1), 512 - prompt_size(n - 1)
    engine.check_request(shorter, NEEDLE_QUESTION, method=method, max_new_tokens=budget)  # fits exactly
    assert engine.prepare(shorter, NEEDLE_QUESTION, method=method, max_new_tokens=budget).num_tokens == 512 - budget  # as the call counts it
    with pytest.raises(ContextTooLongError):
        engine.check_request(shorter, NEEDLE_QUESTION, method=method, max_new_tokens=budget + 1)


def test_an_interrupt_of_the_caller_stops_the_requests_waiting_for_the_model(engine, monkeypatch):
    """Ctrl-C in the thread that called answer_many: the requests still waiting for the model give
    up, instead of the pool running every one of them before the interrupt comes out."""
    import threading
    import time
    from concurrent.futures import wait as real_wait

    import qgpm.batching
    from qgpm.runtime import model_turn

    ran, lock = [], threading.Lock()

    def answer(**kw):
        with model_turn(engine.model):
            with lock:
                ran.append(kw["question"])
            time.sleep(0.1)
        return kw["question"]

    def interrupted_wait(futures, **kw):
        real_wait(futures, timeout=0.25)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "answer", answer)
    monkeypatch.setattr(engine, "check_request", lambda **kw: None)
    monkeypatch.setattr(qgpm.batching, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        engine.answer_many([dict(context="c", question=f"q{i}") for i in range(12)], max_concurrency=4)
    assert len(ran) <= 5, ran  # those that held the model by the interrupt, not all 12
