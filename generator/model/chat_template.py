"""A model's chat template: the Jinja2 text that turns a conversation into the model's prompt, from
tokenizer_config.json (`chat_template`), a chat_template.jinja beside it, or a GGUF file's
`tokenizer.chat_template`; or a template file the user gives (`chat --chat-template FILE`) for a
model that has none, rendered with the model's BOS and EOS token texts all the same.

The template comes from the model, so it is rendered in Jinja2's immutable sandbox (no attribute
access to Python internals, no mutation of the messages), as transformers renders it, and its output
is only ever tokenized: it never reaches a generated C source.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import update_wrapper
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ColibriError
from ..files import CONFIG_BYTES, TEMPLATE_BYTES, check_json_nesting, optional_file, read_text_limited
from .gguf import is_gguf

if TYPE_CHECKING:
    from .gguf.file import GgufFile


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""
    origin: str = "chat template"

    def __post_init__(self):
        # Whatever holds it (tokenizer_config.json, a GGUF string), a template is compiled whole.
        if (
            len(self.source) > TEMPLATE_BYTES // 4
            and len(self.source.encode("utf-8", "surrogatepass")) > TEMPLATE_BYTES
        ):
            size = len(self.source.encode("utf-8", "surrogatepass"))
            raise ColibriError(
                f"{self.origin}: the chat template's {size:,} bytes exceed the limit of {TEMPLATE_BYTES:,}"
            )

    @staticmethod
    def for_model(model_dir: Path) -> "ChatTemplate | None":
        """The template of a model directory (or GGUF file), or None when it has none."""
        model_dir = Path(model_dir)
        if is_gguf(model_dir):
            return ChatTemplate._from_gguf(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = read_tokenizer_config(config_path)
        source, origin = config.get("chat_template"), config_path.name
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        jinja = model_dir / "chat_template.jinja"
        if source is None and optional_file(jinja, str(jinja)):
            source, origin = read_text_limited(jinja, TEMPLATE_BYTES, str(jinja)), jinja.name
        if source is None:
            return None
        if not isinstance(source, str):
            raise ColibriError(f"{config_path}: chat_template is not a string")
        return ChatTemplate(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")), origin)

    @staticmethod
    def _from_gguf(path: Path) -> "ChatTemplate | None":
        from .gguf.file import read_gguf
        from .gguf.tokenizer import chat_template

        gguf = read_gguf(path)
        source = chat_template(gguf)
        if source is None:
            return None
        bos, eos = _gguf_token_texts(gguf)
        return ChatTemplate(source, bos, eos, f"{path.name}: tokenizer.chat_template")

    @staticmethod
    def from_file(template: Path, model_dir: Path) -> "ChatTemplate":
        """A Jinja2 template file, as tokenizer_config.json's chat_template would hold it, for the
        model at `model_dir` (whose BOS and EOS token texts it gets)."""
        template, model_dir = Path(template), Path(model_dir)
        source = read_text_limited(template, TEMPLATE_BYTES, f"--chat-template {template}")
        if is_gguf(model_dir):
            from .gguf.file import read_gguf

            bos, eos = _gguf_token_texts(read_gguf(model_dir))
        else:
            config = read_tokenizer_config(model_dir / "tokenizer_config.json")
            bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        return ChatTemplate(source, bos, eos, f"--chat-template {template.name}")

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the template renders it, within the budgets below (ColibriError, one
        line naming the template's file, for a template that fails or goes past one)."""
        from jinja2 import TemplateError

        def raise_exception(message):
            raise TemplateError(message)

        text = sum(len(m.get("content") or "") for m in messages if isinstance(m, dict))
        budget = _Budget(BUDGET_FACTOR * (RENDER_FIXED_CHARS + text), RENDER_SECONDS)
        holder = [budget]
        env = _budget_environment(holder)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        where = f"the model's chat template ({self.origin})"
        try:
            with _watchdog(budget.seconds):
                pieces = []
                stream = env.from_string(self.source).generate(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                )
                for piece in stream:
                    pieces.append(budget.charge(piece))
                return "".join(pieces)
        except _OverBudget as e:
            raise ColibriError(f"{where} was stopped: {e}") from None
        except TemplateError as e:
            raise ColibriError(f"{where} failed: {_one_line(e)}") from None
        except RecursionError:
            raise ColibriError(f"{where} failed: it calls itself too deeply") from None
        except MemoryError:
            raise ColibriError(f"{where} failed: it ran out of memory") from None
        except Exception as e:  # a legal template may still raise anything Python raises (1/0, none + 1)
            raise ColibriError(f"{where} failed: {type(e).__name__}: {_one_line(e)}") from None


# ---- rendering under budgets ------------------------------------------------------------------
#
# A template comes from the internet and Jinja2's sandbox bounds what it may touch, not how long it
# runs or how much it makes: two nested range(100000) loops print 10^10 strings. So every rendering
# runs under three budgets, set at 100 x what the largest real templates need (measured on the 71
# model templates llama.cpp ships in models/templates, rendering a 4-message conversation, and on
# SmolLM2's and the Qwen templates the tests use; see docs/commands.md#chat-template-budgets):
# - time: RENDER_SECONDS (the slowest real one, Apertus-8B-Instruct, took 52 ms with its compile);
# - characters made: 100 x (RENDER_FIXED_CHARS + the messages' own text), counting every piece of
#   output, every buffered block or macro body, every concatenation, operator and call result (the
#   most any real template made, GigaChat3's, is 30,556 characters, 5,149 of them its output, for
#   65 characters of messages; longer messages add about 5 characters made per character);
# - numbers: integers of at most MAX_INT_BITS bits from * and **, and no call argument or format
#   width larger than the character budget.
# Checks come before the work wherever a result's size can be known first (repetition, powers,
# replace, join, indent, padding, format widths), so memory stays bounded by the character budget.
RENDER_SECONDS = 5.0
RENDER_FIXED_CHARS = 32 * 1024
BUDGET_FACTOR = 100
MAX_INT_BITS = 4096
_MESSAGE_LIMIT = 300  # characters of a template's own error message repeated in ours


class _OverBudget(Exception):
    """A rendering went past one of its budgets."""


class _Budget:
    def __init__(self, chars: int, seconds: float):
        self.chars, self.seconds = chars, seconds
        self.made = 0
        self.deadline = time.monotonic() + seconds

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"it ran longer than its {self.seconds:g} s budget")

    def need(self, n: int) -> None:
        """Refuse work that would make n more characters (or items) than the budget has left."""
        if n < 0 or self.made + n > self.chars:
            raise _OverBudget(f"it made more than its budget of {self.chars:,} characters")

    def charge(self, value: Any) -> Any:
        """Count a value the template made (its length if it has one) and return it."""
        self.tick()
        if isinstance(value, (str, list, tuple, dict)):
            self.need(len(value))
            self.made += len(value)
        elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
            raise _OverBudget(f"it made an integer of more than {MAX_INT_BITS} bits")
        return value

    def check_number(self, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.chars:
            raise _OverBudget(f"it passed a number larger than its budget of {self.chars:,} characters")

    def check_widths(self, text: str, given: int = 0) -> int:
        """A format string's widths and precisions ('%999999999d', '{:>999999999}'), counted as every
        number in it, plus `given` (widths from arguments, or fields formatted before): refused when
        together they pass what the budget has left; their sum otherwise."""
        runs = re.findall(r"\d+", text)
        total = given + sum(int(digits) for digits in runs if len(digits) <= 12)
        if any(len(digits) > 12 for digits in runs) or self.made + total > self.chars:
            raise _OverBudget(f"its format string asks for a width past its budget of {self.chars:,} characters")
        return total

    def check_percent(self, text: str, values: tuple) -> None:
        """text % values: its own widths, and those '*' takes from the values ('%*.*f')."""
        for value in values:
            self.check_number(value)
        stars = [v for v in values if isinstance(v, int) and not isinstance(v, bool)] if "*" in text else []
        self.check_widths(text, sum(abs(v) for v in stars))


class _BudgetBuffer(list):
    """A block's output buffer (a macro body, {% set %}...{% endset %}, a filter block): every
    piece counted as it is appended."""

    budget: _Budget

    def append(self, item):
        super().append(self.budget.charge(item))

    def extend(self, items):
        for item in items:
            self.append(item)


def _codegen_class():
    from jinja2.compiler import CodeGenerator

    class BudgetCodeGenerator(CodeGenerator):
        def buffer(self, frame) -> None:
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.budget_buffer()")

        def visit_Concat(self, node, frame) -> None:
            self.write("environment.budget.charge(")
            super().visit_Concat(node, frame)
            self.write(")")

    return BudgetCodeGenerator


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else len(str(value))


def _estimate(name: str, subject: Any, args: tuple, kwargs: dict) -> int | None:
    """How many characters a string operation known to multiply its input would make (None: it
    makes at most about as many as it is given, which the budget counts afterwards)."""
    if not isinstance(subject, str):
        return None
    pick = lambda i, key, default: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name == "replace":
        old, new = pick(0, "old", ""), pick(1, "new", "")
        if isinstance(old, str) and isinstance(new, str):
            return len(subject) + (subject.count(old) if old else len(subject) + 1) * max(0, len(new) - len(old))
    if name == "expandtabs":
        size = pick(0, "tabsize", 8)
        return len(subject) + subject.count("\t") * size if isinstance(size, int) else None
    if name == "indent":  # the filter: the width (a number or a string) before every line
        width = pick(0, "width", 4)
        return len(subject) + (subject.count("\n") + 1) * (width if isinstance(width, int) else _sized(width))
    if name == "wordwrap":
        width, wrap = pick(0, "width", 79), pick(3, "wrapstring", "\n")
        if isinstance(width, int) and width > 0:
            return len(subject) + (len(subject) // width + 1) * _sized(wrap or "\n")
    return None


def _budget_environment(budget_holder: list):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BudgetSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        code_generator_class = _codegen_class()

        @property
        def budget(self) -> _Budget:
            return budget_holder[0]

        def budget_buffer(self) -> _BudgetBuffer:
            buffer = _BudgetBuffer()
            buffer.budget = self.budget
            return buffer

        def call_binop(self, context, operator, left, right):
            budget = self.budget
            budget.tick()
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if operator == "*":
                if ints:
                    if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                        raise _OverBudget(f"it made an integer of more than {MAX_INT_BITS} bits")
                else:
                    seq, times = (left, right) if isinstance(right, int) else (right, left)
                    if isinstance(times, int) and isinstance(seq, (str, list, tuple)):
                        budget.need(len(seq) * max(0, times))
            elif operator == "**" and ints and right > 0 and abs(left) > 1:
                if left.bit_length() * right > MAX_INT_BITS:
                    raise _OverBudget(f"it made an integer of more than {MAX_INT_BITS} bits")
            elif operator == "%" and isinstance(left, str):
                budget.check_percent(left, right if isinstance(right, tuple) else (right,))
            return budget.charge(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            budget = __self.budget
            budget.tick()
            for value in (*args, *kwargs.values()):
                budget.check_number(value)
            bound = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            subject, name = getattr(bound, "__self__", None), getattr(bound, "__name__", "")
            if isinstance(subject, str):
                if name == "join" and args:
                    items = list(args[0])
                    budget.need(len(subject) * max(0, len(items) - 1) + sum(_sized(i) for i in items))
                    args = (items, *args[1:])
                made = _estimate(name, subject, args, kwargs)
                if made is not None:
                    budget.need(made)
            return budget.charge(super().call(__context, __obj, *args, **kwargs))

        def wrap_str_format(self, value):
            """str.format and str.format_map, formatted field by field by a formatter that checks
            each field's format spec once its nested fields are filled in ('{0:{1}}' with '999999999'
            as the argument): every width and precision str.format takes, however it is given."""
            if super().wrap_str_format(value) is None:
                return None
            template, format_map = value.__self__, value.__name__ == "format_map"

            def checked(*args, **kwargs):
                if format_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    args, kwargs = (), args[0]
                return type(template)(_budget_formatter(self, template).vformat(template, args, kwargs))

            return update_wrapper(checked, value)

        def getattr(self, obj, attribute):
            self.budget.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            self.budget.tick()
            return super().getitem(obj, argument)

    env = BudgetSandbox(trim_blocks=True, lstrip_blocks=True)
    for name, function in list(env.filters.items()):
        env.filters[name] = _budget_filter(name, function, budget_holder)
    del env.globals["lipsum"]  # paragraphs of filler on demand: no chat template needs them
    return env


def _budget_filter(name: str, function, budget_holder: list):
    def budgeted(*args, **kwargs):
        budget = budget_holder[0]
        budget.tick()
        values = [a for a in args if not _is_context(a)]
        for value in (*values[1:], *kwargs.values()):
            budget.check_number(value)
        if values:
            subject = values[0]
            if name == "format" and isinstance(subject, str):  # subject % args
                budget.check_percent(subject, (*values[1:], *kwargs.values()))
            elif name == "join":
                items = list(subject)
                sep = values[1] if len(values) > 1 else kwargs.get("d", "")
                budget.need(_sized(sep) * max(0, len(items) - 1) + sum(_sized(i) for i in items))
                args = tuple(items if a is subject else a for a in args)
            elif name == "tojson":
                indent = values[1] if len(values) > 1 else kwargs.get("indent")
                if isinstance(indent, int) and indent > 0:
                    budget.need(len(json.dumps(subject, default=str)) * (1 + indent))
            made = _estimate(name, subject, tuple(values[1:]), kwargs)
            if made is not None:
                budget.need(made)
        return budget.charge(function(*args, **kwargs))

    for marker in ("jinja_pass_arg",):  # keep how jinja2 passes the context or environment
        if hasattr(function, marker):
            setattr(budgeted, marker, getattr(function, marker))
    return budgeted


def _budget_formatter(env, template: str):
    """jinja2's sandboxed formatter (its field lookups go through the sandbox) whose every field's
    resolved format spec is checked against the budget before it is formatted."""
    from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
    from markupsafe import Markup

    base = SandboxedEscapeFormatter if isinstance(template, Markup) else SandboxedFormatter

    class BudgetFormatter(base):  # type: ignore[valid-type, misc]
        widths = 0  # of the fields formatted so far in this call: '{:3000000}' ten times is refused too

        def format_field(self, value, format_spec):
            self.widths = env.budget.check_widths(format_spec, self.widths)
            return super().format_field(value, format_spec)

    return BudgetFormatter(env, escape=template.escape) if isinstance(template, Markup) else BudgetFormatter(env)


def _is_context(value: Any) -> bool:
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, (Context, EvalContext, Environment))


@contextmanager
def _watchdog(seconds: float):
    """SIGALRM after `seconds` in the main thread (what interrupts a loop that makes nothing); in
    another thread the budget's own clock, read at every operation, is the watchdog."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum, frame):
        raise _OverBudget(f"it ran longer than its {seconds:g} s budget")

    previous = signal.signal(signal.SIGALRM, ring)
    started = time.monotonic()
    outer, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:  # someone else's alarm (a test runner's timeout, say) keeps what it had left
            left = max(outer - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + "…"


def _token_text(value) -> str:
    """bos_token / eos_token of tokenizer_config.json: a string or an AddedToken-like object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def read_tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json as a dict ({} when there is none)."""
    if not optional_file(path, str(path)):
        return {}
    text = read_text_limited(path, CONFIG_BYTES, str(path))
    check_json_nesting(text, str(path))
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ColibriError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(config, dict):
        raise ColibriError(f"{path}: not a JSON object")
    return config


def _gguf_token_texts(gguf: GgufFile) -> tuple[str, str]:
    """The texts of a GGUF file's BOS and EOS tokens ("" for one it does not name)."""
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")

    def token_text(key: str) -> str:
        value = gguf.metadata.get(key)
        if (
            isinstance(tokens, list)
            and isinstance(value, int)
            and not isinstance(value, bool)
            and 0 <= value < len(tokens)
            and isinstance(tokens[value], str)
        ):
            return tokens[value]
        return ""

    return token_text("tokenizer.ggml.bos_token_id"), token_text("tokenizer.ggml.eos_token_id")
