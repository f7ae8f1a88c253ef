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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ColibriError
from .gguf import is_gguf

if TYPE_CHECKING:
    from .gguf.file import GgufFile


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""
    origin: str = "chat template"

    @staticmethod
    def for_model(model_dir: Path) -> "ChatTemplate | None":
        """The template of a model directory (or GGUF file), or None when it has none."""
        model_dir = Path(model_dir)
        if is_gguf(model_dir):
            return ChatTemplate._from_gguf(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = _tokenizer_config(config_path)
        source, origin = config.get("chat_template"), config_path.name
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        jinja = model_dir / "chat_template.jinja"
        if source is None and jinja.is_file():
            source, origin = jinja.read_text(encoding="utf-8"), jinja.name
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
        try:
            source = template.read_text(encoding="utf-8")
        except OSError as e:
            raise ColibriError(f"--chat-template {template}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ColibriError(f"--chat-template {template}: not UTF-8 text") from None
        if is_gguf(model_dir):
            from .gguf.file import read_gguf

            bos, eos = _gguf_token_texts(read_gguf(model_dir))
        else:
            config = _tokenizer_config(model_dir / "tokenizer_config.json")
            bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        return ChatTemplate(source, bos, eos, f"--chat-template {template.name}")

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.source).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as e:
            raise ColibriError(f"the model's chat template ({self.origin}) failed: {e}") from None


def _token_text(value) -> str:
    """bos_token / eos_token of tokenizer_config.json: a string or an AddedToken-like object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json as a dict ({} when there is none)."""
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
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
