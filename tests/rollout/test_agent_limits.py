"""Bounded requests, through the real ``openai`` client against the endpoint: more choices than
``rollout.agent_max_choices``, an episode's call beyond ``rollout.agent_max_calls`` and a body over the
endpoint's limit are each refused with a 4xx naming the limit, counted, and nothing of them is sampled."""

from __future__ import annotations

import httpx
import openai
import pytest

from areal_trainer.rollout.agents.endpoint import MAX_BODY_BYTES

from .test_agent_endpoint import QUESTION, TIMEOUT, stack  # noqa: F401 - the module's server fixture


def test_more_choices_than_the_limit_are_a_400_naming_it(stack):  # noqa: F811
    session, key = stack.episode(max_choices=2)
    client = stack.client(key)
    with pytest.raises(openai.BadRequestError, match=r"n=1000 is more choices .* rollout.agent_max_choices=2") as e:
        client.chat.completions.create(model="policy", messages=QUESTION, n=1000)
    assert e.value.body["param"] == "n"
    assert not session.records and session.counters.bad_requests == 1
    assert len(client.chat.completions.create(model="policy", messages=QUESTION, n=2).choices) == 2


def test_a_call_beyond_the_episodes_limit_is_a_429_and_the_earlier_calls_stay(stack):  # noqa: F811
    session, key = stack.episode(max_calls=2)
    client = stack.client(key)
    for _ in range(2):
        client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.RateLimitError, match=r"made its 2 calls \(rollout.agent_max_calls\)") as e:
        client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    assert e.value.status_code == 429
    assert [r.call for r in session.records] == [0, 1] and session.counters.bad_requests == 1


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_a_413_without_being_read_whole(stack, declared):  # noqa: F811
    session, key = stack.episode()
    big = b'{"messages": [], "pad": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}'
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = stack.server.base_url + "/chat/completions"
    if declared:
        resp = httpx.post(url, content=big, headers=headers, timeout=TIMEOUT)
    else:  # chunked, no Content-Length: the limit holds while reading
        resp = httpx.post(url, content=iter([big[i:i + 2 ** 20] for i in range(0, len(big), 2 ** 20)]),
                          headers=headers, timeout=TIMEOUT)
    assert resp.status_code == 413, resp.text
    assert f"at most {MAX_BODY_BYTES} are accepted" in resp.json()["error"]["message"]
    assert not session.records and session.counters.bad_requests == 1
