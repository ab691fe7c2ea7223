"""Stop strings (``gconfig.stop``): the rule of ``rollout/engines/stops.py`` (hand-made cases, and the fast
functions against a one-prefix-at-a-time reference on random cases), the ``hf`` engine (an answer ends
at the token that completes a stop string, across the segments of a partial rollout; without stop
strings nothing changes), the ``vllm`` engine's step driver (with a scripted stand-in for vLLM), the
workflow (nothing after a stop string is trained on) and the config check."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_trainer.config.sampling import GenerationHyperparameters
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines import hf as engine_mod
from areal_trainer.rollout.engines.hf import HFEngine, rollout_copy
from areal_trainer.rollout.engines.stops import may_have_stopped, stop_at, stop_strings, text_of
from areal_trainer.rollout.engines.vllm import VLLMEngine
from areal_trainer.rollout.engines.weights import WeightGate
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow, prompt_ids
from tests.groups import reward_service

CPU = torch.device("cpu")
TOK = build_tokenizer()


def reference(tok, ids: list[int], stops, min_tokens: int = 0) -> int | None:
    """The rule, one prefix at a time: the fewest tokens whose text holds a stop string that ends after
    the text of the first ``min_tokens`` tokens."""
    base = len(text_of(tok, ids[:min_tokens]))
    for k in range(min_tokens + 1, len(ids) + 1):
        text = text_of(tok, ids[:k])
        if any(text.startswith(s, j) and j + len(s) > base for s in stops for j in range(len(text))):
            return k
    return None


def ids_of(*pieces: str) -> list[int]:
    ids = TOK.convert_tokens_to_ids(list(pieces))
    assert TOK.unk_token_id not in ids or "<unk>" in pieces
    return ids


# -- the rule, by hand --------------------------------------------------------------------------
QUESTION = ids_of("▁How", "▁many", "▁apples", "▁are", "▁there", "?")  # " How many apples are there?"


@pytest.mark.parametrize("stops,keep", [
    (["ppl"], 3),  # inside one token: that token is kept whole
    (["ny ap"], 3),  # across tokens: kept up to the one that completes it
    (["How many"], 2),
    (["How"], 1),  # at the very first token
    ([" H"], 1),
    (["?"], 6),  # at the last token
    (["there", "many"], 2),  # two stop strings: the one completed first
    (["many", "there"], 2),
    (["apple pie"], None),  # no stop string
    (["?!"], None),
    ([], None),
])
def test_the_token_that_completes_a_stop_string_is_the_last_one(stops, keep):
    assert stop_at(TOK, QUESTION, stops) == keep == reference(TOK, QUESTION, stops)


def test_text_is_decoded_without_special_tokens():
    ids = ids_of("▁2", "<eos>", "<pad>", "▁1", ".")  # text " 2 1."
    assert stop_at(TOK, ids, ["2 1"]) == 4
    assert stop_at(TOK, ids, ["<eos>"]) is None


@pytest.mark.parametrize("stops,min_tokens,keep", [
    (["How"], 1, None),  # it ends within the first min_tokens tokens: it does not count
    (["How many"], 1, 2),  # it starts there and ends after: it counts
    (["How", "are"], 1, 4),
    (["are"], 2, 4),
    (["?"], 6, None),  # no token after the first min_tokens
    (["?"], 9, None),
])
def test_only_text_after_min_tokens_counts(stops, min_tokens, keep):
    assert stop_at(TOK, QUESTION, stops, min_tokens=min_tokens) == keep == reference(TOK, QUESTION, stops, min_tokens)


def test_checked_tokens_are_not_searched_again():
    assert stop_at(TOK, QUESTION, ["there"], checked=2) == 5
    assert stop_at(TOK, QUESTION, ["there"], checked=6) is None


def test_the_filter_looks_at_the_new_tokens_and_those_just_before():
    long = QUESTION + ids_of("▁are") * 8  # "there" is token 5 of 14
    answers = [long, long, long, long, QUESTION]
    # new tokens from 13 (the window: the last 7 tokens), 10, 4 and 14 (none); a short answer whole
    assert may_have_stopped(TOK, answers, [13, 10, 4, 14, 5], ["there"]) == [False, True, True, False, True]
    assert may_have_stopped(TOK, answers, [2] * 5, []) == [False] * 5


def test_stop_strings_of_a_gconfig():
    assert stop_strings(SimpleNamespace()) == () == stop_strings(GenerationHyperparameters())
    assert stop_strings(SimpleNamespace(stop=None)) == ()
    assert stop_strings(GenerationHyperparameters(stop=["a", "</b>"])) == ("a", "</b>")
    assert stop_strings(SimpleNamespace(stop="</b>")) == ("</b>",)


# -- the fast functions against the reference -----------------------------------------------------
def _smollm2_tokenizer():
    """SmolLM2's byte-level BPE tokenizer (multi-byte characters, leading spaces), where a converted
    checkpoint exists on this machine; None elsewhere."""
    from transformers import AutoTokenizer

    from areal_trainer.model import smollm2

    for root in (smollm2.cache_root(), os.path.expanduser(os.path.join("~", ".cache", "areal_trainer"))):
        path = os.path.join(root, smollm2.DIR_NAME)
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return AutoTokenizer.from_pretrained(path)
    return None


TOKENIZERS = {"builtin": TOK}
_SMOL = _smollm2_tokenizer()
if _SMOL is not None:
    TOKENIZERS["smollm2"] = _SMOL


@st.composite
def cases(draw, tok):
    n_vocab = len(tok)
    # Mostly tokens of a small range (texts that repeat, so stop strings recur), some from anywhere.
    token = st.one_of(st.integers(0, min(n_vocab, 40) - 1), st.integers(0, n_vocab - 1))
    ids = draw(st.lists(token, max_size=30))
    text = text_of(tok, ids)
    other = text_of(tok, draw(st.lists(token, min_size=1, max_size=4)))
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        source = draw(st.sampled_from([text, other])) or other
        start = draw(st.integers(0, max(0, len(source) - 1)))
        stops.append(source[start:start + draw(st.integers(1, 6))])
    # A stop string holding U+FFFD (the text of an incomplete UTF-8 sequence) is outside the rule's
    # assumption: the character is replaced once the sequence completes.
    stops = [s for s in stops if s and "\ufffd" not in s] or ["?"]
    min_tokens = draw(st.one_of(st.just(0), st.integers(0, len(ids))))
    steps = draw(st.lists(st.integers(1, 3), min_size=len(ids), max_size=len(ids)))
    return ids, stops, min_tokens, steps


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_fast_functions_equal_the_reference(name):
    tok = TOKENIZERS[name]

    @settings(max_examples=300 if name == "builtin" else 150, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(tok), data=st.data())
    def check(case, data):
        ids, stops, min_tokens, steps = case
        want = reference(tok, ids, stops, min_tokens)
        assert stop_at(tok, ids, stops, min_tokens=min_tokens) == want
        checked = data.draw(st.integers(0, want - 1 if want else len(ids)))
        assert stop_at(tok, ids, stops, min_tokens=min_tokens, checked=checked) == want
        # An engine's scan: after each step (1 to 3 new tokens) the filter, then the exact check. The
        # answer ends at the step that holds the token completing the stop string: the filter misses none.
        done, found = 0, None
        for step in steps:
            if done >= len(ids):
                break
            end = min(len(ids), done + step)
            [maybe] = may_have_stopped(tok, [ids[:end]], [done], stops)
            if maybe and (keep := stop_at(tok, ids[:end], stops, min_tokens=min_tokens)) is not None:
                found = (keep, end)
                break
            done = end
        if want is None:
            assert found is None
        else:
            assert found == (want, end) and done < want <= end

    check()


# -- the hf engine ------------------------------------------------------------------------------
PROMPTS = [prompt_ids(TOK, [{"role": "user", "content": f"What is {i} + {i + 2}?" + " Tom has 3 apples." * (i % 3)}])
           for i in range(4) for _ in range(2)]  # two samples per prompt (their prefill is shared)
G = GenerationHyperparameters(max_new_tokens=16, temperature=1.0)


@pytest.fixture(scope="module")
def model():
    return build_model("builtin:tiny", TOK, seed=0).eval()


def _generate(engine, g, seed=0, switch=None):
    torch.manual_seed(seed)
    if switch is not None:
        engine.schedule_update(*switch)
    return engine.generate(PROMPTS, g)


def _stops_seen_in(gens) -> list[str]:
    """Stop strings the answers contain: the text of two tokens of the first answer, and of one token of
    the second (found in other answers too, at other places)."""
    stops = [text_of(TOK, gens[0].output_ids[3:5]).strip(), text_of(TOK, gens[1].output_ids[2:3]).strip()[:1]]
    return [s for s in stops if s]


def _assert_cut(plain, stopped, stops, min_tokens=0) -> int:
    """Each answer is the plain one up to the token completing a stop string, not truncated; unchanged
    when it holds none. Returns how many were cut."""
    cut = 0
    for x, y in zip(plain, stopped, strict=True):
        assert len(y.output_ids) == len(y.logprobs) == len(y.versions)
        keep = reference(TOK, x.output_ids, stops, min_tokens)
        if keep is None:
            assert y == x
        else:
            assert (y.output_ids, y.logprobs, y.versions) == (x.output_ids[:keep], x.logprobs[:keep], x.versions[:keep])
            assert not y.truncated
            cut += 1
    return cut


@pytest.mark.parametrize("engine_kw,g_kw", [
    ({}, {}),
    ({"share_prefill": False}, {}),
    ({}, {"max_tokens": min(map(len, PROMPTS)) + 12}),  # rows of different caps in one call
    ({}, {"min_new_tokens": 4}),
    ({"stoppable": True}, {"greedy": True}),
], ids=["plain", "no-shared-prefill", "caps", "min-new-tokens", "stoppable-greedy"])
def test_hf_answers_end_at_the_token_that_completes_a_stop_string(model, engine_kw, g_kw):
    engine = HFEngine(model, TOK, device=CPU, **engine_kw)
    g = dataclasses.replace(G, **g_kw)
    plain = _generate(engine, g)
    stops = _stops_seen_in(plain)
    stopped = _generate(engine, dataclasses.replace(g, stop=stops))
    assert _assert_cut(plain, stopped, stops, g.min_new_tokens) >= 2
    assert stop_at(TOK, stopped[0].output_ids, stops, min_tokens=g.min_new_tokens) == len(stopped[0].output_ids)


def test_hf_rows_stop_sampling_at_a_stop_string(model, monkeypatch):
    """Rows end inside ``generate`` (not only when cut afterwards): with a stop string in every answer,
    the call ends once the last row has one."""
    engine = HFEngine(model, TOK, device=CPU)
    forwards = []
    inner = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: forwards.append(1) or inner(*a, **k))
    stops = list("0123456789") + list("aeiouy?.")
    gens = _generate(engine, dataclasses.replace(G, max_new_tokens=40, stop=stops))
    longest = max(len(x.output_ids) for x in gens)
    assert longest < 40 and not any(x.truncated for x in gens)
    assert len(forwards) <= longest + 1  # one step per token, and the shared prefill


def test_hf_stop_string_straddling_a_weight_update(model):
    """A scheduled weight update splits the answers after 5 tokens (a partial rollout): a stop string made
    of tokens 5 and 6 is found across the two segments, and the answer keeps both versions."""
    new = build_model("builtin:tiny", TOK, seed=1).eval()
    engine = HFEngine(rollout_copy(model), TOK, device=CPU, stoppable=True)
    plain = _generate(engine, G, switch=(5, new, 1))
    engine = HFEngine(rollout_copy(model), TOK, device=CPU, stoppable=True)
    # Tokens 5 and 6 of an answer whose text holds them nowhere earlier, nor does any answer's first
    # segment: the same rows then go on after the update, and draw the same random numbers.
    row, stop = next((r, s) for r, x in enumerate(plain) if len(x.output_ids) >= 6
                     for s in [text_of(TOK, x.output_ids[4:6])]
                     if stop_at(TOK, x.output_ids, [s]) == 6
                     and all((stop_at(TOK, y.output_ids, [s]) or 6) >= 6 for y in plain))
    stopped = _generate(engine, dataclasses.replace(G, stop=[stop]), switch=(5, new, 1))
    assert _assert_cut(plain, stopped, [stop]) >= 1
    assert len(stopped[row].output_ids) == 6 and stopped[row].versions == [0] * 5 + [1]


def test_hf_without_stop_strings_nothing_changes(model, monkeypatch):
    """``stop=[]`` and a gconfig without the attribute make the same calls (no extra stopping criterion)
    and give the same answers."""
    def refuse(*args, **kwargs):
        raise AssertionError("a stop-string criterion without stop strings")

    monkeypatch.setattr(engine_mod, "_StopStrings", refuse)
    engine = HFEngine(model, TOK, device=CPU)
    calls = []
    inner = model.generate

    def generate(*args, **kwargs):
        calls.append(sorted(kwargs))
        return inner(*args, **kwargs)

    monkeypatch.setattr(model, "generate", generate)
    legacy = SimpleNamespace(**{f.name: getattr(G, f.name) for f in dataclasses.fields(G) if f.name != "stop"})
    a, b = _generate(engine, legacy), _generate(engine, dataclasses.replace(G, stop=[]))
    assert a == b and calls[0] == calls[1] and "stopping_criteria" not in calls[0]


# -- the vllm engine's step driver, with a scripted stand-in for vLLM ------------------------------
class ScriptedLLMEngine:
    """What ``VLLMEngine._generate_in_steps`` uses of vLLM's ``LLMEngine``. The answer to prompt ``[1, k]``
    is ``scripts[k]``, one token per step (resubmitted answers continue where they were); a request
    ends at EOS or at ``max_tokens`` new tokens."""

    def __init__(self, scripts: list[list[int]]):
        self.scripts, self.live, self.aborted, self.added = scripts, {}, [], []

    def add_request(self, rid, prompt, params):
        ids = prompt["prompt_token_ids"]
        self.live[rid] = [ids[1], len(ids) - 2, 0, params]  # answer, tokens so far, new tokens, params
        self.added.append((rid, len(ids) - 2))
        return f"internal-{rid}"

    def step(self):
        outs = []
        for rid, req in list(self.live.items()):
            k, at, n_new, params = req
            t = self.scripts[k][at + n_new]
            req[2] += 1
            finished = t == TOK.eos_token_id or req[2] >= params.max_tokens
            reason = "stop" if t == TOK.eos_token_id else "length" if finished else None
            c = SimpleNamespace(token_ids=[t], logprobs=[{t: SimpleNamespace(logprob=-0.5 - 0.01 * t)}],
                                finish_reason=reason)
            outs.append(SimpleNamespace(request_id=rid, outputs=[c], finished=finished, num_cached_tokens=0))
            if finished:
                del self.live[rid]
        return outs

    def abort_request(self, ids, internal=False):
        assert internal
        self.aborted += ids
        for i in ids:
            self.live.pop(i.removeprefix("internal-"), None)


def scripted_vllm(scripts, interruptible=False) -> VLLMEngine:
    engine = object.__new__(VLLMEngine)  # no vLLM here: only the driver is exercised
    engine.tokenizer, engine.vocab_size, engine.max_positions = TOK, len(TOK), 512
    engine.gate, engine.interruptions = WeightGate(0, interruptible), 0
    engine._request_ids, engine._sampling_params, engine._delta = iter(range(1000)), SimpleNamespace, "delta"
    engine.llm = SimpleNamespace(llm_engine=ScriptedLLMEngine(scripts))
    return engine


SCRIPTS = [
    QUESTION + ids_of("▁How", "▁many") * 3,  # " How many apples are there? How many ..."
    ids_of("▁Tom", "▁has", "▁2", "▁apples", ".", "<eos>") + QUESTION,
    ids_of("▁Tom", "▁had", "▁1", "▁apples", "▁and", "▁2", "▁pens") * 2,
]


@pytest.mark.parametrize("interruptible", [False, True])
def test_vllm_answers_end_at_the_token_that_completes_a_stop_string(interruptible):
    engine = scripted_vllm(SCRIPTS, interruptible)
    llm = engine.llm.llm_engine
    if interruptible:  # an update interrupts every answer after its third token
        steps = iter([False] * 3 + [True] + [False] * 100)
        engine.gate.pending = lambda: next(steps)
    g = GenerationHyperparameters(max_new_tokens=10, stop=["apples are", "es ar", "2 pens"])
    gens = engine.generate([[1, 0], [1, 1], [1, 2]], g)
    # "apples are" straddles the interruption (tokens 3 and 4)
    assert [x.output_ids for x in gens] == [QUESTION[:4], SCRIPTS[1][:6], SCRIPTS[2][:7]]
    assert [x.truncated for x in gens] == [False, False, False]
    assert all(len(x.logprobs) == len(x.versions) == len(x.output_ids) for x in gens)
    assert llm.live == {} and len(llm.aborted) == 2 + (3 if interruptible else 0)
    assert engine.interruptions == (1 if interruptible else 0)
    if interruptible:
        assert sorted(n for _, n in llm.added) == [0, 0, 0, 3, 3, 3]


def test_vllm_stop_string_on_the_last_allowed_token_is_not_truncated():
    engine = scripted_vllm(SCRIPTS)
    gens = engine.generate([[1, 0], [1, 2]], GenerationHyperparameters(max_new_tokens=6, stop=["?", "Leo"]))
    assert [x.output_ids for x in gens] == [QUESTION, SCRIPTS[2][:6]]
    assert [x.truncated for x in gens] == [False, True]


def test_vllm_stop_strings_agree_with_the_hf_engine_on_the_same_tokens():
    """The same answer, cut by each engine: the hf engine's cut of its own answers (above) and the vllm
    driver's cut of scripted ones follow one rule (``stop_at``)."""
    for stops, g_min in ((["many"], 0), (["How"], 1), ([" 2"], 3)):
        engine = scripted_vllm(SCRIPTS)
        g = GenerationHyperparameters(max_new_tokens=12, min_new_tokens=g_min, stop=stops)
        gens = engine.generate([[1, 0], [1, 1], [1, 2]], g)
        for k, x in enumerate(gens):
            full = SCRIPTS[k][:12]
            full = full[:full.index(TOK.eos_token_id) + 1] if TOK.eos_token_id in full else full
            keep = reference(TOK, full, stops, g_min)
            assert x.output_ids == (full[:keep] if keep else full)


# -- the workflow -------------------------------------------------------------------------------
def test_workflow_trains_on_nothing_after_a_stop_string(model):
    engine = HFEngine(model, TOK, device=CPU)
    wf = RLVRWorkflow(engine=engine, tokenizer=TOK, reward=reward_service(max_error_fraction=1.0))
    samples = [{"messages": [{"role": "user", "content": f"What is {i} + 2?"}], "answer": "#### 3"} for i in range(3)]
    torch.manual_seed(0)
    plain = wf.rollout(samples, dataclasses.replace(G, n_samples=4))
    first = plain[0]["input_ids"][0][plain[0]["loss_mask"][0] == 1].tolist()
    stops = [text_of(TOK, first[2:4]).strip(), text_of(TOK, first[5:6]).strip()[:1]]
    torch.manual_seed(0)
    groups = wf.rollout(samples, dataclasses.replace(G, n_samples=4, stop=stops))
    cut = 0
    for group in groups:
        for r in range(group.n_rows):
            trained = group["input_ids"][r][group["loss_mask"][r] == 1].tolist()
            text, before_last = text_of(TOK, trained), text_of(TOK, trained[:-1])
            holds = any(s in text for s in stops)
            if holds:  # the last trained token completes the stop string: nothing after it is trained on
                cut += 1
                assert not any(s in before_last for s in stops) and not bool(group["is_truncated"][r])
            assert len(trained) == int((group["versions"][r] >= 0).sum())
    assert cut >= 2


# -- the config ---------------------------------------------------------------------------------
def test_config_accepts_stop_strings_and_names_the_key_of_a_bad_one():
    assert GenerationHyperparameters(stop=["</answer>", "\n\n"]).check("gconfig") == []
    [msg] = GenerationHyperparameters(stop=["</answer>", ""]).check("eval_gconfig")
    assert msg.startswith("eval_gconfig.stop: got ['</answer>', '']") and "non-empty" in msg and "''" in msg
    [msg] = GenerationHyperparameters(stop=[3]).check("gconfig")
    assert msg.startswith("gconfig.stop: got [3]")
    [msg] = GenerationHyperparameters(stop="</answer>").check("gconfig")
    assert "gconfig.stop=['</answer>']" in msg
