"""Chat: a conversation with the firmware on a board, its KV cache kept between turns.

Every turn renders the whole conversation with the model's chat template, but sends the firmware
only what is new: the text the firmware already holds (the previous prompts and replies, as the
template renders them) is a prefix of the new rendering, so the new request carries the last reply
token (sampled, never fed back) and the tokens of the text after that prefix, at the position where
the firmware's KV cache ends. When the template rewrites earlier text (some strip or reformat past
replies), the whole conversation is prefilled again from position 0, and the turn says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ColibriError
from .model.chat_template import ChatTemplate
from .model.tokenizer import Tokenizer

# A reply's length unless --steps says otherwise (it also ends at the model's end-of-turn, and
# never runs past the context): a few paragraphs, not the rest of the context.
DEFAULT_REPLY_STEPS = 256


@dataclass(frozen=True)
class TurnPlan:
    prompt: list[int]  # the tokens this turn sends
    start: int  # where they go: the positions the firmware holds before the turn
    steps: int  # the most tokens the reply may have (max_steps, or what is left of the context)
    reprefilled: bool  # the template changed earlier text: everything was sent again
    rendered: str  # the whole conversation up to this turn's reply, as the template renders it


@dataclass
class ChatState:
    template: ChatTemplate
    tokenizer: Tokenizer
    n_ctx: int
    max_steps: int
    messages: list[dict[str, str]] = field(default_factory=list)
    held: int = 0  # positions the firmware's KV cache holds
    pending: list[int] = field(default_factory=list)  # the last reply token: sampled, not fed back yet
    text: str = ""  # what held + pending stand for, as the template renders the conversation so far
    largest_ctx: int | None = None  # the largest context this board and model allow (None: not known)

    def plan_turn(self, user: str) -> TurnPlan:
        """The request for the user's next message; ColibriError when the context is full."""
        messages = [*self.messages, {"role": "user", "content": user}]
        rendered = self.template.render(messages, add_generation_prompt=True)
        if self.held and rendered.startswith(self.text):
            prompt = self.pending + self.tokenizer.encode(rendered[len(self.text) :], special=False)
            start, reprefilled = self.held, False
        else:
            prompt = self.tokenizer.encode(rendered, special=False)
            start, reprefilled = 0, self.held > 0
        if not prompt:
            raise ColibriError("the chat template renders this message to no new tokens")
        room = self.n_ctx - start - len(prompt) + 1  # the last reply token is never fed back
        if room < 1:
            raise ColibriError(
                f"the context is full: the conversation would need {start + len(prompt)} of the "
                f"{self.n_ctx} positions this firmware was built for ({self._when_full()})"
            )
        self.messages = messages
        return TurnPlan(prompt, start, min(self.max_steps, room), reprefilled, rendered)

    def _when_full(self) -> str:
        """What to do about a full context: never a --ctx the board and model would refuse."""
        if self.largest_ctx is None:
            return "start a new chat, or build with a larger --ctx"
        if self.largest_ctx <= self.n_ctx:
            return f"start a new chat; this board and model allow no larger context than {self.n_ctx}"
        return f"start a new chat, or build with a larger --ctx, at most {self.largest_ctx}"

    def finish_turn(self, plan: TurnPlan, reply: list[int], held: int) -> str:
        """Record the reply the firmware gave (its tokens, and the positions it now holds); returns
        the reply's text."""
        expected = plan.start + len(plan.prompt) + max(0, len(reply) - 1)
        if held != expected:
            raise ColibriError(f"the firmware holds {held} positions after the turn, expected {expected}")
        text = self.tokenizer.decode(reply)
        self.messages.append({"role": "assistant", "content": text})
        self.held = held
        self.pending = reply[-1:]
        self.text = plan.rendered + self.tokenizer.decode(reply, skip_special=False)
        return text
