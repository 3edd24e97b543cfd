"""Token-in, token-out rendering (rftlib.envs.chat) on real chat templates: tokenizers only, no model forward.

Templates: SmolLM2-135M-Instruct's own (the embedded model's tokenizer), and Qwen2.5-Instruct's, copied into
tests/data/qwen2_5_chat_template.jinja from Qwen2.5-Instruct's tokenizer_config.json ``chat_template`` (no
Qwen2.5 tokenizer ships offline, so it is set on a copy of the embedded tokenizer, which has ChatML's
<|im_start|> and <|im_end|> as special tokens too); and a Qwen3-style template written here that drops the
<think> of assistant turns before the last user message.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from rftlib.envs.chat import TemplateError, check_prefix_preserving, env_span, render_ids
from rftlib.envs.trajectory import Trajectory
from rftlib.models.loading import load_tokenizer

QWEN25 = (Path(__file__).parent / "data" / "qwen2_5_chat_template.jinja").read_text()

# Qwen3's rule, reduced: an assistant turn before the last user message loses its <think>...</think>
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content %}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

OPENING = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "Calculate 123 * 456."}]
TURN1 = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 456"}}\n</tool_call>'
TOOL = {"role": "tool", "content": "56088"}
TURN2 = "The product is \\boxed{56088}."


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def qwen25(smol):
    tok = copy.deepcopy(smol)
    tok.chat_template = QWEN25
    return tok


def sampled(tok, text: str) -> list[int]:
    """Stand-in for a model turn as an engine samples it: the text's ids, then the stop token."""
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


@pytest.mark.parametrize("which, span_text", [
    # SmolLM2's template: every message as <|im_start|>role\ncontent<|im_end|>\n
    ("smol", "\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n"),
    # Qwen2.5's: a tool result inside a user turn, in <tool_response> tags
    ("qwen25", "\n<|im_start|>user\n<tool_response>\n56088\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
])
def test_incremental_rendering_equals_the_templates_rendering_of_the_whole_conversation(request, which, span_text):
    tok = request.getfixturevalue(which)
    traj = Trajectory(render_ids(tok, OPENING, add_generation_prompt=True))
    turn1 = sampled(tok, TURN1)
    traj.add_model(turn1, [-0.5] * len(turn1))
    history = [*OPENING, {"role": "assistant", "content": TURN1}]
    span = env_span(tok, history, [TOOL])
    traj.add_env(span)
    turn2 = sampled(tok, TURN2)
    traj.add_model(turn2, [-0.25] * len(turn2))

    full = render_ids(tok, [*history, TOOL, {"role": "assistant", "content": TURN2}], add_generation_prompt=False)
    ctx = traj.context()
    # the trajectory is the template's rendering, up to the last model stop token; the template adds "\n" after
    assert full[:len(ctx)] == ctx and tok.decode(full[len(ctx):]) == "\n"
    # the environment's span is what the template puts after the model's <|im_end|>: the boundary newline the
    # engine never samples, the tool's message, the next generation prompt
    assert tok.decode(span) == span_text
    # masks at known positions: turn 1 (stop token included), the span, turn 2
    n1, ns, n2 = len(turn1), len(span), len(turn2)
    assert traj.model_mask == [1] * n1 + [0] * ns + [1] * n2
    assert traj.ids[n1 - 1] == tok.eos_token_id and tok.decode([traj.ids[n1]]) == "\n"
    assert traj.logprobs == [-0.5] * n1 + [0.0] * ns + [-0.25] * n2
    assert (traj.model_tokens, traj.env_tokens, traj.turns) == (n1 + n2, ns, 2)


@pytest.mark.parametrize("which", ["smol", "qwen25"])
def test_smollm2_and_qwen25_templates_are_prefix_preserving(request, which):
    check_prefix_preserving(request.getfixturevalue(which))


def test_a_template_that_drops_earlier_reasoning_is_refused_with_the_position(smol):
    tok = copy.deepcopy(smol)
    tok.chat_template = QWEN3_STYLE
    opening = [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What is 2 + 2?"}]
    # the assistant's text starts right after the prompt's tokens; its first token is "<think>"'s first, which the
    # re-render (think dropped) replaces by "The"'s
    where = len(render_ids(tok, opening, add_generation_prompt=True))
    said = (rf"{re.escape(tok.name_or_path)}.*appending the environment's user message\(s\) changes the tokens "
            rf"already rendered, first at position {where} ")
    with pytest.raises(TemplateError, match=said):
        check_prefix_preserving(tok)
    # a tool result after the turn keeps its reasoning (only a user message drops it): that probe alone passes
    check_prefix_preserving(tok, roles=("tool",))
    # and the per-turn check refuses the real conversation the same way
    history = [*opening, {"role": "assistant", "content": "<think>\nsum\n</think>\n\n\\boxed{4}"}]
    with pytest.raises(TemplateError, match=f"first at position {where} "):
        env_span(tok, history, [{"role": "user", "content": "Sure?"}])


def test_a_template_that_changes_the_prompt_or_has_no_stop_token_is_refused(smol):
    tok = copy.deepcopy(smol)
    # the generation prompt says "assistant", the rendered turn "bot": the prompt does not survive the turn
    tok.chat_template = ("{%- for m in messages %}{{- '<|im_start|>' + ('bot' if m.role == 'assistant' else m.role)"
                         " + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
                         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    with pytest.raises(TemplateError, match="rendering the assistant's turn after the generation prompt"):
        check_prefix_preserving(tok)
    tok.chat_template = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    with pytest.raises(TemplateError, match="renders the assistant turn with none of the stop tokens"):
        env_span(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                 [{"role": "user", "content": "bye"}])
