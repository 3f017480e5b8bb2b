"""What the load test sends: real CIFAR-10 test JPEGs and real held-out sentences with one [MASK].

Synthetic inputs (one blank image, one fixed sentence) would hide costs a real workload has:
varying JPEG sizes to decode, varying token counts. By default the inputs are the small real
samples installed with the package (`loadtests/data/`), so the locustfile runs anywhere (a
container, a laptop, an installed wheel); GMLP_LOADTEST_CIFAR and GMLP_LOADTEST_TEXT point it at
the full data sets instead.

The served masked LM has a fixed window of `n` tokens and answers 422 to longer texts, which would
count as failures; sentences therefore carry their token count (exact with the `tokenizers`
library and the BERT vocabulary when available, else a deliberately pessimistic estimate) and
are filtered to fit the window the server reports in GET /models.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.errors import UserError
from contract.formats import MASK_TOKEN

log = logging.getLogger(__name__)

# The package's own data files (installed with it, see pyproject's package-data).
BUNDLED_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_SENTENCES = BUNDLED_DIR / "sentences.tsv"

MIN_WORDS, MAX_WORDS = 5, 30
UPLOAD_MODES = ("multipart", "raw", "mixed")


@dataclass(frozen=True)
class LoadConfig:
    """Workload settings, read from `GMLP_LOADTEST_*` environment variables (locust has no own flags)."""

    classify_weight: int = 1
    fill_mask_weight: int = 1
    classify_model: str | None = None
    fill_mask_model: str | None = None
    top_k: int = 5
    upload: str = "multipart"
    cifar_path: Path | None = None
    text_path: Path | None = None
    tokenizer_path: Path | None = None
    max_tokens: int | None = None
    max_sentences: int = 5000
    seed: int = 0
    think_time_s: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoadConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(f"GMLP_LOADTEST_{name}", "").strip()
            return value or None

        def path(name: str) -> Path | None:
            """A file the variable names (checked here, not in each locust process), or None."""
            value = get(name)
            if value is None:
                return None
            if not (found := Path(value).expanduser()).is_file():
                raise FileNotFoundError(f"GMLP_LOADTEST_{name}={found} does not exist")
            return found

        def integer(name: str, default: int, minimum: int) -> int:
            value = get(name)
            number = default if value is None else int(value)
            if number < minimum:
                raise UserError(f"GMLP_LOADTEST_{name}={number}: must be >= {minimum}")
            return number

        upload = (get("UPLOAD") or "multipart").lower()
        if upload not in UPLOAD_MODES:
            raise UserError(f"GMLP_LOADTEST_UPLOAD={upload}: expected one of {UPLOAD_MODES}")
        max_tokens = get("MAX_TOKENS")
        config = cls(
            classify_weight=integer("CLASSIFY_WEIGHT", 1, 0),
            fill_mask_weight=integer("FILL_MASK_WEIGHT", 1, 0),
            classify_model=get("CLASSIFY_MODEL"),
            fill_mask_model=get("FILL_MASK_MODEL"),
            top_k=integer("TOP_K", 5, 1),
            upload=upload,
            cifar_path=path("CIFAR"),
            text_path=path("TEXT"),
            tokenizer_path=path("TOKENIZER"),
            max_tokens=int(max_tokens) if max_tokens else None,
            max_sentences=integer("MAX_SENTENCES", 5000, 1),
            seed=integer("SEED", 0, 0),
            think_time_s=float(get("THINK_TIME") or 0.0),
        )
        if config.classify_weight == 0 and config.fill_mask_weight == 0:
            raise UserError("GMLP_LOADTEST_CLASSIFY_WEIGHT and GMLP_LOADTEST_FILL_MASK_WEIGHT are both 0")
        return config


# -- images ----------------------------------------------------------------------------------------


def load_images(npz_path: Path | None = None) -> tuple[list[bytes], str]:
    """(JPEG files, where they came from): the CIFAR-10 *test* JPEGs (never seen in training) of
    the given npz, as the bytes a client would upload, else the bundled JPEGs."""
    if npz_path is not None:
        import numpy as np

        with np.load(npz_path) as data:
            blob, offsets = data["test_jpeg"], data["test_offsets"]
        return [blob[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)], str(npz_path)
    bundled = sorted(BUNDLED_DIR.glob("*.jpg"))
    if not bundled:
        raise FileNotFoundError(f"no bundled JPEGs in {BUNDLED_DIR}: set GMLP_LOADTEST_CIFAR to an npz")
    return [p.read_bytes() for p in bundled], f"{BUNDLED_DIR} ({len(bundled)} bundled JPEGs)"


# -- sentences -------------------------------------------------------------------------------------

_ABBREVIATIONS = ("Mr.", "Mrs.", "Dr.", "St.", "Mme.", "Messrs.", "Jr.", "Sr.", "Prof.", "Capt.", "Col.")
# Sentence ends: . ! ? optionally followed by a closing quote, then space and a capital or a quote.
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z])|(?<=[.!?][\"'])\s+(?=[\"'A-Z])")
# Plain prose only: no brackets (would clash with [MASK]), underscores (italics), digits-heavy tables.
_PROSE = re.compile(r"^[A-Za-z0-9 ,.;:!?'\"-]+$")
_MASKABLE = re.compile(r"^(\W*)([A-Za-z]{3,})(\W*)$")


def split_sentences(text: str) -> list[str]:
    """Sentences of plain prose with MIN_WORDS..MAX_WORDS words, from Gutenberg's hard-wrapped text."""
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        pieces: list[str] = []
        for piece in _SPLIT.split(flat):
            # "Mr. Bowen" is not a sentence end: glue the pieces back together.
            if pieces and pieces[-1].endswith(_ABBREVIATIONS):
                pieces[-1] += " " + piece
            else:
                pieces.append(piece)
        for sentence in pieces:
            words = sentence.split()
            if not MIN_WORDS <= len(words) <= MAX_WORDS or not _PROSE.match(sentence):
                continue
            if sentence.upper() == sentence:  # headings, shouting
                continue
            sentences.append(sentence)
    return sentences


def mask_one_word(sentence: str, rng: random.Random) -> str | None:
    """The sentence with one word of 3+ letters replaced by [MASK] (punctuation kept), or None."""
    words = sentence.split(" ")
    candidates = [i for i, w in enumerate(words) if _MASKABLE.match(w)]
    if not candidates:
        return None
    i = rng.choice(candidates)
    match = _MASKABLE.match(words[i])
    assert match is not None
    words[i] = match.group(1) + MASK_TOKEN + match.group(3)
    return " ".join(words)


def estimate_tokens(text: str) -> int:
    """A pessimistic WordPiece token count (with [CLS] and [SEP]) for when `tokenizers` is missing.

    Punctuation marks are one token each; short words one; longer words are assumed to split
    into pieces of about four characters; then 25% on top (dialect and names split more). On
    held-out Gutenberg sentences this under-counts fewer than 1 in 1000 against the BERT
    vocabulary; over-counting only drops some usable sentences.
    """
    pieces = 0
    for chunk in text.split(MASK_TOKEN):
        for token in re.findall(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]", chunk):
            pieces += 1 if len(token) <= 6 else math.ceil(len(token) / 4)
    return 2 + text.count(MASK_TOKEN) + math.ceil(pieces * 1.25)


def token_counter(tokenizer_path: Path | None = None) -> tuple[Callable[[str], int], str]:
    """(count function, description): exact with `tokenizers` and the given tokenizer.json, else the
    estimate (no tokenizer given, e.g. GMLP_LOADTEST_TOKENIZER unset, or `tokenizers` missing)."""
    if tokenizer_path is None:
        return estimate_tokens, "estimated (no GMLP_LOADTEST_TOKENIZER)"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return estimate_tokens, "estimated (tokenizers not installed)"
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return (lambda text: len(tokenizer.encode(text).ids)), f"counted with {tokenizer_path}"


@dataclass(frozen=True)
class MaskedSentence:
    text: str
    n_tokens: int  # including [CLS] and [SEP]


def read_sentences_tsv(path: Path) -> list[MaskedSentence]:
    """The bundled `n_tokens<TAB>text` file (token counts precomputed with the BERT vocabulary)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        n_tokens, text = line.split("\t", 1)
        out.append(MaskedSentence(text, int(n_tokens)))
    return out


def load_sentences(config: LoadConfig) -> tuple[list[MaskedSentence], str]:
    """(masked sentences, source): the given text (or TSV), else the bundled TSV."""
    path = config.text_path
    if path is None or path.suffix == ".tsv":
        tsv = path or BUNDLED_SENTENCES
        return read_sentences_tsv(tsv), f"{tsv} (bundled, token counts precomputed)"
    count, how = token_counter(config.tokenizer_path)
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        candidates = split_sentences(f.read())
    # Up to max_sentences of them, each with one random word masked (reproducible by the seed).
    rng = random.Random(config.seed)
    rng.shuffle(candidates)
    sentences = []
    for sentence in candidates:
        if (masked := mask_one_word(sentence, rng)) is not None:
            sentences.append(MaskedSentence(masked, count(masked)))
        if len(sentences) >= config.max_sentences:
            break
    return sentences, f"{path} ({len(sentences)} sentences, tokens {how})"


def fitting(sentences: list[MaskedSentence], max_tokens: int | None) -> list[MaskedSentence]:
    """The sentences that fit a window of `max_tokens` tokens (all of them when it is unknown)."""
    if max_tokens is None:
        return list(sentences)
    return [s for s in sentences if s.n_tokens <= max_tokens]


# -- request bodies --------------------------------------------------------------------------------


def jpeg_body(image: bytes, multipart: bool) -> tuple[bytes, str]:
    """(body, Content-Type header) of a JPEG upload: the raw bytes, or a multipart/form-data form
    with the image in field `file`, as a browser's upload sends it.

    Locust's FastHttpSession has no `files=` argument, so the body is built here, once per image.
    """
    if not multipart:
        return image, "image/jpeg"
    boundary = f"gmlp-loadtest-{random.getrandbits(64):016x}"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="image.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return head + image + tail, f"multipart/form-data; boundary={boundary}"
