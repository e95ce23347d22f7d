"""The plain words prompts are built from, shared by the tokenizer-driven prompt builder (tokenize) and the
server-fitted one (promptfit)."""

# Short common words: each is one token (with its leading space) in the usual BPE vocabularies.
COMMON_WORDS = (
    "the of and to in is was for on that with as by at from his her an be this are or which had not but "
    "it have one all were they new more has two first its also after who been time their year up other "
    "into she when would can out him over there about only some we so most these three many may use no "
    "then part city such made them game four five six like any each make"
).split()
