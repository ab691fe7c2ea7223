"""The bound computation's intra-op threads: a call runs on ``ADVANTAGE_THREADS``, gives the caller its
count back (also after an error), and the count changes no bit of any result."""

import pytest
import torch

from areal_trainer.advantage import AdvantageFn, AdvantageInputs
from areal_trainer.advantage.pipeline import run_default
from areal_trainer.advantage.threads import ADVANTAGE_THREADS, intra_op_threads
from areal_trainer.components.advantage import bind_advantage

from .helpers import actor, batch, norm


@pytest.fixture
def two_threads():
    """torch on two intra-op threads for the test (the suite's default may be one), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def recording(cfg, seen: list, **kw) -> AdvantageFn:
    """The default computation of ``cfg``, noting the thread count it runs on."""
    stages = bind_advantage(cfg).stages

    def run(inputs):
        seen.append(torch.get_num_threads())
        return run_default(inputs, stages)

    return AdvantageFn(run, "recording", stages, **kw)


DATA = batch([[0, 1, 1, 0], [0, 1, 1, 1]], [1.0, 2.0])


def test_one_thread_inside_callers_count_after(two_threads):
    assert ADVANTAGE_THREADS == 1
    seen = []
    recording(actor(), seen)(AdvantageInputs(DATA, actor()))
    assert seen == [1]
    assert torch.get_num_threads() == 2
    assert bind_advantage(actor()).threads == ADVANTAGE_THREADS  # what the trainer is given


def test_none_keeps_the_callers_count(two_threads):
    seen = []
    recording(actor(), seen, threads=None)(AdvantageInputs(DATA, actor()))
    assert seen == [2]


def test_count_restored_after_an_error(two_threads):
    fn = AdvantageFn(lambda inputs: 1 / 0, "failing", None)
    with pytest.raises(ZeroDivisionError):
        fn(AdvantageInputs(DATA, actor()))
    assert torch.get_num_threads() == 2


def test_intra_op_threads_nests_and_restores(two_threads):
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
        with intra_op_threads(None):
            assert torch.get_num_threads() == 1
        with intra_op_threads(2):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def random_batch(n_rows: int, width: int) -> dict:
    """Rows of random lengths with generated turns between other spans, values, a reference policy."""
    g = torch.Generator().manual_seed(width)
    pos = torch.arange(width)[None, :]
    attn = pos < torch.randint(width // 2, width + 1, (n_rows, 1), generator=g)
    seg = (torch.rand(n_rows, width, generator=g) < 1 / 32).long().cumsum(-1)
    loss_mask = (torch.rand(n_rows, width, generator=g) < 0.7).gather(1, seg) & attn & (pos >= 8)
    logprobs = -torch.rand(n_rows, width, generator=g)
    return {"input_ids": torch.zeros(n_rows, width, dtype=torch.long), "attention_mask": attn.long(),
            "loss_mask": loss_mask.long(), "logprobs": logprobs, "rewards": torch.randn(n_rows, generator=g),
            "values": torch.randn(n_rows, width, generator=g),
            "ref_logp": logprobs - 0.1 * torch.rand(n_rows, width, generator=g),
            "is_truncated": torch.rand(n_rows, generator=g) < 0.5,
            "turn_ids": torch.where(loss_mask, seg, -1).int()}


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (a bytewise comparison also tells -0.0 from 0.0)."""
    return t.to(torch.uint8) if t.dtype == torch.bool else t.contiguous().view(-1).view(torch.uint8)


VAPO = "areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae"
BATCH, GROUP = norm("batch", "batch"), norm("group", "group", group_size=8)
CONFIGS = {  # every estimator and lambda kind, the KL reward, both normalisations at both levels
    "token": dict(gae_timestep_unit="token"),
    "token-gl-kl-advbatch": dict(gae_timestep_unit="token", discount=0.99, gae_lambda=0.95, kl_ctl=0.05,
                                 adv_norm=BATCH),
    "token-vapo-advgroup-rewgroup": dict(gae_timestep_unit="token", discount=0.99, gae_lambda=VAPO, adv_norm=GROUP,
                                         reward_norm=GROUP),
    "turn-kl-advgroup": dict(gae_timestep_unit="turn", kl_ctl=0.05, adv_norm=GROUP),
    "turn-gl-rewgroup": dict(gae_timestep_unit="turn", discount=0.99, gae_lambda=0.95, reward_norm=GROUP),
    "turn-vapo-kl-advbatch": dict(gae_timestep_unit="turn", discount=0.99, gae_lambda=VAPO, kl_ctl=0.05,
                                  adv_norm=BATCH),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_results_bytewise_equal_on_one_and_two_threads(name):
    """Every kernel of the default computation sums in an order that does not depend on the thread count
    (at 32 x 2048 every pass over the batch is large enough to be split between two threads)."""
    kw = CONFIGS[name]
    data = random_batch(32, 2048)
    cfg = actor(**kw, **({"gae_lambda_kwargs": {"alpha": 0.05}} if kw.get("gae_lambda") == VAPO else {}))
    stages = bind_advantage(cfg).stages
    results = [AdvantageFn(lambda i: run_default(i, stages), "t", stages, threads=n)(AdvantageInputs(data, cfg))
               for n in (1, 2)]
    one, two = ({k: getattr(r, k) for k in ("advantages", "returns", "loss_mask", "logprobs", "outcome_rewards",
                                            "total_rewards", "kl_rewards")} | dict(r.extras) for r in results)
    assert one.keys() == two.keys()
    for name in one:
        assert one[name].dtype == two[name].dtype and torch.equal(raw(one[name]), raw(two[name])), name
