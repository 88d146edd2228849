"""Small talk: a message made only of greetings, thanks, acknowledgements, laughter and goodbyes ("ok
thanks", "Sounds good!", "lol 😂", "👍") can hold no memory.

The extract stage skips extraction for it (``engram_workers.extraction.trivial``) and ``get_context``
shows no excerpt of it (a greeting is never context). Anything else, even one content word ("thanks, I
moved to Austin"), is not small talk. Bare "no"/"nope" are not on the list on purpose: a short negation
can retract something said before, which is worth an extraction.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["is_trivial"]

# Small talk is short; a long message made of these words is unusual enough to deserve a look.
_MAX_WORDS = 8


def _phrases(spec: str) -> tuple[str, ...]:
    return tuple(p for p in spec.split("|") if p)


_PHRASES = _phrases(
    # greetings
    "hi|hii|hello|hey|heya|hiya|howdy|yo|sup|greetings|hi there|hello there|hey there|good morning|"
    "good afternoon|good evening|good night|morning|evening|gm|gn|whats up|how are you|how r u|"
    "hows it going|"
    # thanks
    "thanks|thank you|thank u|thx|thnx|thanx|ty|tysm|tyvm|cheers|thanks a lot|thanks so much|"
    "thank you so much|thank you very much|thanks again|many thanks|much appreciated|appreciate it|"
    "i appreciate it|you rock|you are the best|youre the best|"
    # acknowledgements
    "ok|okay|k|kk|okey|okie|okey dokey|alright|all right|sure|sure thing|yes|yeah|yep|yup|ya|yea|"
    "yes please|cool|nice|great|awesome|perfect|good|fine|neat|sweet|wonderful|excellent|amazing|"
    "fantastic|got it|gotcha|understood|noted|i see|makes sense|that makes sense|fair enough|sounds good|"
    "sounds great|sounds perfect|sounds fine|will do|right|true|indeed|exactly|of course|agreed|"
    "no problem|no worries|np|all good|youre welcome|you are welcome|welcome|my pleasure|good job|"
    "well done|nice one|love it|that is great|thats great|that is cool|thats cool|that helps|"
    "that helped|interesting|wow|oh|ah|aha|hm|hmm|um|uh|oops|please|"
    # laughter
    "lol|lmao|lmfao|rofl|xd|"
    # goodbyes
    "bye|bye bye|goodbye|good bye|see you|see ya|see you later|see you soon|later|ttyl|talk later|"
    "talk to you later|take care|brb|gtg|g2g|gotta go|have a good day|have a nice day|"
    "have a great day|have a good one|you too|same to you"
)
# Longest first, so "thank you so much" is taken whole rather than as "thank you" plus leftovers.
_ALTERNATIVES = "|".join(re.escape(p) for p in sorted(_PHRASES, key=len, reverse=True))
_LAUGH = r"(?:a*h+(?:a+h+)+a*|(?:he)+h?|(?:hi){2,}|lo+l+(?:o+l+)*|lmf?a+o+)"
_TRIVIAL = re.compile(rf"(?:{_ALTERNATIVES}|{_LAUGH})(?:\s+(?:{_ALTERNATIVES}|{_LAUGH}))*")
_NON_WORD = re.compile(r"[\W_]+")
_RUN3 = re.compile(r"(\w)\1{2,}")


def is_trivial(text: str) -> bool:
    """True when ``text`` is only small talk (or empty, emoji, punctuation), so nothing can be learned."""
    if not isinstance(text, str):
        return False
    folded = unicodedata.normalize("NFKC", text).casefold().replace("'", "").replace("’", "")
    words = _NON_WORD.sub(" ", folded).split()
    if not words:
        return True  # empty, whitespace, punctuation or emoji only
    if len(words) > _MAX_WORDS:
        return False
    norm = " ".join(words)
    # Stretched words ("okkk", "thanksss", "cooool") collapse to one or two letters; try both.
    return any(_TRIVIAL.fullmatch(form) for form in (norm, _RUN3.sub(r"\1", norm), _RUN3.sub(r"\1\1", norm)))
