"""JAAS configuration text: the broker's JAAS file and Kafka's inline `sasl.jaas.config` entry.

A file holds sections, `Name { <entry>* };`, and an entry is
`<login module class> <control flag> (<option>=<value>)* ;`, as Java's ConfigFile and Kafka's
JaasConfig read them: values are bare words or quoted ('"' or "'") strings with backslash
escapes, `//` and `/* */` are comments, the control flag is required, requisite, sufficient or
optional (any case). This module parses text only; the caller reads the file. Every mistake is
a JaasConfigError naming the line and what is wrong. We are stricter than Java where Java keeps
the last of two values silently (a repeated option or section is an error here), and an empty
section is an error because nothing could authenticate with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# Which SASL mechanisms each login module's credentials serve (Kafka's pairing).
LOGIN_MODULE_MECHANISMS: dict[str, tuple[str, ...]] = {
    PLAIN_LOGIN_MODULE: ("PLAIN",),
    SCRAM_LOGIN_MODULE: ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}
CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")
PLAIN_USER_PREFIX = "user_"  # PlainLoginModule's user_<name>="<password>" options
_PUNCTUATION = "{};="
_QUOTES = "\"'"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "b": "\b"}


class JaasConfigError(ValueError):
    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class LoginModule:
    class_name: str
    control_flag: str  # lower case: one of CONTROL_FLAGS
    options: dict[str, str]
    line: int = field(default=1, compare=False)  # where the entry starts, for error messages

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return LOGIN_MODULE_MECHANISMS.get(self.class_name, ())

    @property
    def username(self) -> str | None:
        return self.options.get("username")

    @property
    def password(self) -> str | None:
        return self.options.get("password")

    @property
    def plain_users(self) -> dict[str, str]:
        """PlainLoginModule's users: option `user_alice="secret"` is user alice."""
        return {key[len(PLAIN_USER_PREFIX) :]: value for key, value in self.options.items()
                if key.startswith(PLAIN_USER_PREFIX) and len(key) > len(PLAIN_USER_PREFIX)}  # fmt: skip


def login_module_for(modules: list[LoginModule], mechanism: str) -> LoginModule | None:
    """The first module whose credentials serve `mechanism` (Kafka picks it the same way)."""
    return next((m for m in modules if mechanism in m.mechanisms), None)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "word", "string", one of _PUNCTUATION, or "end"
    text: str
    line: int

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the text"
        return f"{self.text!r}" if self.kind != "string" else f'the string "{self.text}"'


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position, line, length = 0, 1, len(text)
    while position < length:  # each pass consumes at least one character
        char = text[position]
        if char == "\n":
            line, position = line + 1, position + 1
        elif _is_space(char):
            position += 1
        elif text.startswith("//", position):
            end = text.find("\n", position)
            position = length if end < 0 else end
        elif text.startswith("/*", position):
            end = text.find("*/", position + 2)
            if end < 0:
                raise JaasConfigError(line, "comment '/*' is not closed with '*/'")
            line += text.count("\n", position, end)
            position = end + 2
        elif char in _PUNCTUATION:
            tokens.append(_Token(char, char, line))
            position += 1
        elif char in _QUOTES:
            value, position = _quoted(text, position, line)
            tokens.append(_Token("string", value, line))
        else:
            start = position
            while position < length and not _ends_word(text, position):
                position += 1
            tokens.append(_Token("word", text[start:position], line))
    tokens.append(_Token("end", "", line))
    return tokens


def _ends_word(text: str, position: int) -> bool:
    char = text[position]
    return (_is_space(char) or char in _PUNCTUATION or char in _QUOTES
            or text.startswith("//", position) or text.startswith("/*", position))  # fmt: skip


def _is_space(char: str) -> bool:
    return char <= " " or char.isspace()  # Kafka's tokenizer: every byte 0-32 is whitespace


def _quoted(text: str, start: int, line: int) -> tuple[str, int]:
    """The value of the quoted string opening at `start`, and the position after it. Like Java's
    StreamTokenizer, a string ends at its line's end; a backslash escapes the next character."""
    quote, parts, position = text[start], [], start + 1
    while position < len(text) and text[position] != "\n":
        char = text[position]
        if char == quote:
            return "".join(parts), position + 1
        if char == "\\" and position + 1 < len(text) and text[position + 1] != "\n":
            escaped = text[position + 1]
            parts.append(_ESCAPES.get(escaped, escaped))
            position += 2
            continue
        parts.append(char)
        position += 1
    raise JaasConfigError(line, f"quoted string starting {text[start : start + 20]!r} is not "
                                f"closed with {quote} on the same line")  # fmt: skip


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index = min(self.index + 1, len(self.tokens) - 1)  # "end" repeats
        return token

    def section(self, sections: dict[str, list[LoginModule]], lines: dict[str, int]) -> None:
        name = self.take()
        if name.kind != "word":
            raise JaasConfigError(name.line, f"expected a section name, found {name.describe()}")
        if name.text in sections:
            raise JaasConfigError(name.line, f"section {name.text!r} given twice "
                                             f"(first on line {lines[name.text]})")  # fmt: skip
        opening = self.take()
        if opening.kind != "{":
            raise JaasConfigError(opening.line, f"expected '{{' after section name "
                                                f"{name.text!r}, found {opening.describe()}")  # fmt: skip
        modules = []
        while self.peek().kind not in ("}", "end"):
            modules.append(self.entry())
        closing = self.take()
        if closing.kind == "end":
            raise JaasConfigError(closing.line, f"section {name.text!r} (line {name.line}) "
                                                "is not closed with '};'")  # fmt: skip
        if not modules:
            raise JaasConfigError(closing.line, f"section {name.text!r} has no login module")
        semicolon = self.take()
        if semicolon.kind != ";":
            raise JaasConfigError(semicolon.line, f"expected ';' after '}}' closing section "
                                                  f"{name.text!r}, found {semicolon.describe()}")  # fmt: skip
        sections[name.text], lines[name.text] = modules, name.line

    def entry(self) -> LoginModule:
        name = self.take()
        if name.kind != "word":
            raise JaasConfigError(name.line, "expected a login module class name, found "
                                             f"{name.describe()}")  # fmt: skip
        flag = self.take()
        if flag.kind != "word" or self.peek().kind == "=":  # `Module username=...`
            raise JaasConfigError(flag.line, f"login module control flag not specified for "
                                             f"{name.text} (expected {_flags()})")  # fmt: skip
        if flag.text.lower() not in CONTROL_FLAGS:
            raise JaasConfigError(flag.line, f"invalid login module control flag {flag.text!r} "
                                             f"for {name.text} (expected {_flags()})")  # fmt: skip
        options: dict[str, str] = {}
        option_lines: dict[str, int] = {}
        while self.peek().kind == "word":
            key, value = self.option(name)
            if key.text in options:
                raise JaasConfigError(key.line, f"option {key.text!r} given twice "
                                                f"(first on line {option_lines[key.text]})")  # fmt: skip
            options[key.text], option_lines[key.text] = value, key.line
        end = self.take()
        if end.kind != ";":
            raise JaasConfigError(end.line, f"login module entry {name.text} (line {name.line}) "
                                            f"is not terminated by ';', found {end.describe()}")  # fmt: skip
        return LoginModule(name.text, flag.text.lower(), options, name.line)

    def option(self, module: _Token) -> tuple[_Token, str]:
        key = self.take()
        equals = self.take()
        if equals.kind != "=":
            hint = ""
            if equals.kind == "word" and equals.text.lower() in CONTROL_FLAGS:
                hint = f" (is the ';' after the entry for {module.text} missing?)"
            raise JaasConfigError(equals.line, f"expected '=' after option {key.text!r}, found "
                                               f"{equals.describe()}{hint}")  # fmt: skip
        value = self.take()
        if value.kind not in ("word", "string"):
            raise JaasConfigError(value.line, f"value not specified for option {key.text!r}")
        return key, value.text


def _flags() -> str:
    return ", ".join(CONTROL_FLAGS)


def parse_jaas(text: str) -> dict[str, list[LoginModule]]:
    """Sections of a JAAS file by name (KafkaServer, KafkaClient, ...), entries in file order."""
    parser = _Parser(text)
    sections: dict[str, list[LoginModule]] = {}
    lines: dict[str, int] = {}
    while parser.peek().kind != "end":
        parser.section(sections, lines)
    return sections


def parse_jaas_entry(text: str) -> LoginModule:
    """The single login module of a `sasl.jaas.config` value (Kafka requires exactly one)."""
    parser = _Parser(text)
    modules = []
    while parser.peek().kind != "end":
        start = parser.peek()
        modules.append(parser.entry())
        if len(modules) > 1:
            raise JaasConfigError(start.line, "JAAS config property contains more than one "
                                              "login module, should be 1 module")  # fmt: skip
    if not modules:
        raise JaasConfigError(parser.peek().line, "login module not specified in JAAS config")
    return modules[0]
