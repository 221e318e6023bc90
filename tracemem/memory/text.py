"""Text normalization shared by the lexical ranker and the hashing embedder.

Both rankers must agree on what a "word" is, otherwise fusing their scores
mixes two different views of the same text. The rules are deliberately small
and language-agnostic apart from an English stopword list and a light suffix
stripper ("stemming-lite"): plurals, -ing, -ed, -ly. They are tuned to be
conservative (never shrink a word below three letters) rather than clever.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

__all__ = ["STOPWORDS", "normalize", "words", "terms", "term_tuple", "stem"]

# Function words that carry no topic. Chat fillers ("yeah", "hey") are included
# because memories are often extracted from conversation turns.
STOPWORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are aren't as at be
    because been before being below between both but by can can't cannot could
    couldn't did didn't do does doesn't doing don't down during each few for from
    further had hadn't has hasn't have haven't having he he'd he'll he's her here
    here's hers herself him himself his how how's i i'd i'll i'm i've if in into is
    isn't it it's its itself let's me more most mustn't my myself no nor not of off
    on once only or other ought our ours ourselves out over own same shan't she
    she'd she'll she's should shouldn't so some such than that that's the their
    theirs them themselves then there there's these they they'd they'll they're
    they've this those through to too under until up very was wasn't we we'd we'll
    we're we've were weren't what what's when when's where where's which while who
    who's whom why why's with won't would wouldn't you you'd you'll you're you've
    your yours yourself yourselves s t d ll m re ve just also yeah yes oh hey hi
    really""".split()
)

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


def normalize(text: str) -> str:
    """Lower-case, fold accents and unify apostrophes so 'Café’s' == "cafe's"."""
    if text.isascii():  # the common case: NFKD changes nothing, there is nothing to fold
        return text.lower()
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    text = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in text if not unicodedata.combining(ch))


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Strip a few English suffixes; keeps at least three letters of the stem."""
    if word.endswith("'s"):
        word = word[:-2]
    word = word.replace("'", "")
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith(("ss", "us", "is")):
        return word
    if word.endswith("s"):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[: -len(suffix)]
            if base[-1] == base[-2] and base[-1] not in "lsz":
                base = base[:-1]  # "running" -> "run", "planned" -> "plan"
            return base
    if word.endswith("ly") and len(word) > 5:
        return word[:-2]
    return word


# ASCII letters and digits are what `_WORD` takes of ASCII text (lower-cased here); all else separates words.
_ASCII_WORDS = bytes(c if c < 128 and chr(c).isalnum() else 32 for c in range(256)).lower()


def words(text: str) -> list[str]:
    """All word tokens of `text`, normalized but neither filtered nor stemmed."""
    if text.isascii() and "'" not in text:  # the common case: `_WORD`'s tokens are the runs of letters and digits
        return text.encode("ascii").translate(_ASCII_WORDS).decode("ascii").split()
    return _WORD.findall(normalize(text))


def terms(text: str) -> list[str]:
    """Content terms: stopwords dropped, the rest stemmed. The unit of ranking."""
    return list(term_tuple(text))


@lru_cache(maxsize=16384)
def term_tuple(text: str) -> tuple[str, ...]:
    """`terms`, cached (a tuple, so nobody can change the cached value): a remembered
    text is tokenized by the embedder and then by the lexical index, one after the other."""
    out: list[str] = []
    for w in words(text):
        if w in STOPWORDS:
            continue
        s = stem(w)
        if s and s not in STOPWORDS:
            out.append(s)
    return tuple(out)
