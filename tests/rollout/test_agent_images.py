"""Images in agents' chat requests (``rollout/agents/images.py``): ``image_url`` parts with data URLs are read
into the message's images (the content keeps text parts and ``{"type": "image"}`` placeholders in order); every
other form is a 400 naming the part; a session renders an image request with the policy's processor and
samples it with its images, and one without a processor refuses it saying why."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
import torch
from PIL import Image

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.model import builtin_vlm
from areal_trainer.model.vision import VisionEncoder, VisionInput
from areal_trainer.rollout.agents.images import image_url, with_image_urls
from areal_trainer.rollout.agents.requests import RequestError, parse_chat_request
from areal_trainer.rollout.agents.session import CallRecord, EpisodeSession
from areal_trainer.rollout.agents.tool_parsers import get_parser
from areal_trainer.rollout.agents.trajectory import export_rows, same_images
from areal_trainer.rollout.engines.batcher import GenerationBatcher
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.train.models.logprobs import forward_logprobs

RED = Image.new("RGB", (16, 16), (220, 30, 30))


def _ask(*parts, role="user"):
    return {"messages": [{"role": role, "content": list(parts)}]}


def _text(t):
    return {"type": "text", "text": t}


def _image(url):
    return {"type": "image_url", "image_url": {"url": url}}


def test_an_image_url_part_becomes_the_messages_image_in_its_place():
    request = parse_chat_request(_ask(_image(image_url(RED)), _text("What colour is the square?")))
    (m,) = request.messages
    assert m.content == [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]
    assert len(m.images) == 1 and m.images[0].getpixel((3, 3)) == (220, 30, 30)
    assert request.images == list(m.images)
    # Text parts alone are joined, as before.
    assert parse_chat_request(_ask(_text("a"), _text("b"))).messages[0].content == "a\nb"


def test_a_jpeg_data_url_and_a_path_or_bytes_given_to_image_url_read_alike(tmp_path):
    buf = io.BytesIO()
    RED.save(buf, format="JPEG")
    jpeg = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    (m,) = parse_chat_request(_ask(_image(jpeg))).messages
    assert m.images[0].size == (16, 16)
    RED.save(tmp_path / "red.png")
    assert image_url(tmp_path / "red.png") == image_url(RED) == image_url((tmp_path / "red.png").read_bytes())


@pytest.mark.parametrize("part, words", [
    (_image("https://example.com/cat.png"), "only data URLs (data:image/png;base64,...) are taken, got "
                                            "'https://example.com/cat.png': the trainer fetches nothing"),
    (_image("data:image/png,abc"), "expected a base64 data URL"),
    (_image("data:image/png;base64,@@@"), "the data URL's base64 does not decode"),
    (_image("data:image/png;base64," + base64.b64encode(b"not a picture").decode()), "holds no image PIL can read"),
    ({"type": "image_url"}, "expected the image's URL as a string, got NoneType"),
    ({"type": "input_audio", "input_audio": {}}, "expected a text part {'type': 'text', 'text': ...} or an image part"),
])
def test_a_bad_image_part_is_a_400_naming_it(part, words):
    with pytest.raises(RequestError) as info:
        parse_chat_request(_ask(_text("hi"), part))
    assert info.value.status == 400 and words in info.value.message
    assert info.value.param.startswith("messages[0].content[1]")


def test_images_only_in_user_messages():
    with pytest.raises(RequestError, match="image parts are taken in user messages only"):
        parse_chat_request(_ask(_image(image_url(RED)), role="system"))


def test_with_image_urls_puts_the_rows_pictures_in_place_of_its_placeholders():
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    (m,) = with_image_urls(messages, [RED])
    assert m["content"][0] == _image(image_url(RED)) and m["content"][1] == {"type": "text", "text": "Colour?"}
    assert messages[0]["content"][0] == {"type": "image"}  # the row itself is left as it was


def _session(vision, engine):
    return EpisodeSession(episode=0, tokenizer=engine.tokenizer, batcher=GenerationBatcher(engine),
                          gconfig=GenerationHyperparameters(n_samples=1, max_new_tokens=4), parser=get_parser("hermes"),
                          vision=vision, no_images="rollout.backend='vllm' samples text prompts only")


def _engine():
    tok = builtin_vlm.build_tokenizer()
    model = builtin_vlm.build_model("builtin:tiny-vlm", tok, 0).eval()
    return HFEngine(model, tok, device=torch.device("cpu"))


def test_a_session_samples_an_image_request_with_its_images_and_records_them():
    engine = _engine()
    tok = engine.tokenizer
    vision = VisionEncoder(builtin_vlm.build_processor(tok), tok)
    request = parse_chat_request(_ask(_image(image_url(RED)), _text("What colour is the square?")))
    session = _session(vision, engine)
    asyncio.run(session.create(request))
    (rec,) = session.records
    want_ids, want = vision.encode([{"role": "user", "content": request.messages[0].content}], [RED])
    assert rec.prompt_ids == want_ids and rec.prompt_ids.count(vision.image_token_id) == 16
    assert rec.vision is not None and rec.vision.n_images == 1
    assert (rec.vision.tensors["pixel_values"] == want.tensors["pixel_values"]).all()
    # The engine sampled with the picture: its log-probs are the training forward's with these pixels, not
    # without them.
    ids = torch.tensor([rec.prompt_ids + rec.output_ids])
    p, k = len(rec.prompt_ids), len(rec.output_ids)
    with torch.no_grad():
        seen, _ = forward_logprobs(engine.model, ids, torch.ones_like(ids), temperature=1.0, vision=[rec.vision])
        blue, _ = forward_logprobs(engine.model, ids, torch.ones_like(ids), temperature=1.0,
                                   vision=[vision.encode([{"role": "user", "content": [{"type": "image"}]}],
                                                         [Image.new("RGB", (16, 16), (30, 60, 220))])[1]])
    torch.testing.assert_close(seen[0, p - 1:p - 1 + k], torch.tensor(rec.logprobs), rtol=0, atol=1e-4)
    assert (blue[0, p - 1:p - 1 + k] - seen[0, p - 1:p - 1 + k]).abs().max() > 1e-4


def test_a_session_without_a_processor_refuses_an_image_request_saying_why():
    engine = _engine()
    session = _session(None, engine)
    with pytest.raises(RequestError) as info:
        asyncio.run(session.create(parse_chat_request(_ask(_image(image_url(RED)), _text("Colour?")))))
    assert info.value.status == 400
    assert info.value.message == ("the request carries 1 image, but rollout.backend='vllm' samples text prompts only; "
                                  "send text only.")
    assert session.counters.bad_requests == 1 and not session.records


def _record(call, prompt, output, vision):
    return CallRecord(f"c{call}", 0, call, prompt, output, [-0.5] * len(output), [0] * len(output), False,
                      vision=vision)


def test_a_call_continues_a_row_only_with_the_rows_pictures():
    """Image tokens are the same ids for every picture: a call whose ids extend a row's but whose picture is
    another starts a row of its own; with the same picture (equal pixels) it continues the row."""
    red, blue = (VisionInput({"pixel_values": torch.full((1, 3, 4, 4), v)}, 1) for v in (0.1, 0.9))
    first = _record(0, [1, 7, 7, 2], [5], red)
    same = _record(1, [1, 7, 7, 2, 5, 3], [6], VisionInput({"pixel_values": torch.full((1, 3, 4, 4), 0.1)}, 1))
    other = _record(1, [1, 7, 7, 2, 5, 3], [6], blue)
    rows, _ = export_rows([first, same], [1.0, 1.0], "concat")
    assert len(rows) == 1 and rows[0].calls == 2 and rows[0].vision is same.vision
    rows, fallbacks = export_rows([first, other], [1.0, 1.0], "concat")
    assert [r.vision for r in rows] == [red, blue] and fallbacks == 1
    assert not same_images(None, red) and same_images(None, None)
