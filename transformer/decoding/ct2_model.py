"""Running a CTranslate2 export (`mt-export`) in place of our model: `CT2Model`.

Shapes: B batch (sentences), S source length.

    model, tokenizer, device = loading.load_for_inference("exports/tatoeba_int8", "cpu")
    text.translate_nbest(model, tokenizer, lines, DecodeConfig())  # as with a checkpoint

`loading.load_for_inference` returns a `CT2Model` for a directory holding export.json,
and `text.translate_nbest` calls its `search(src_ids, cfg)` where it would call
`search.search(model, src_ids, cfg)`: the same padded source ids in (no BOS or EOS), the
same n-best lists of `Hypothesis` out, so normalising, cutting long inputs, batching,
input order, empty lines, n-best output and the progress bar are shared code.

How a DecodeConfig becomes `Translator.translate_batch` arguments:
- method=greedy: beam_size=1; method=beam: beam_size=K and num_hypotheses=K (all K
  finished hypotheses come back; we rank them and keep decode.nbest).
- Maximum length: our limit a * |x| + b is per sentence (capped by the position table,
  raised to min_len); CTranslate2 takes one max_decoding_length per call, so the
  sentences of a batch are grouped by their limit L, one call per group. Both write at
  most L tokens. A hypothesis that reaches L without EOS is closed by search.py with a
  forced EOS whose log-probability counts in its score; CTranslate2 stops it without one,
  so we add that log-probability (`score_batch`, on those of them that can still rank
  among the n-best).
- method=sample: beam_size=1 and decode.sampling_topk, sampling_topp and
  sampling_temperature as CTranslate2's options of the same names (our sampling_topk=0,
  the whole vocabulary, is CTranslate2's 0 too). decode.seed: CTranslate2's workers seed
  their generators once, when they start, from `ctranslate2.set_random_seed`; so a
  sampling call runs on a translator of its own, made after setting the seed and kept
  for later calls with the same seed (`_engine`), whose draws go on where the last
  stopped. The same input with the same seed and settings, in a new process (or a new
  CT2Model), gives the same translations with one worker (`threads=1`); with several,
  which worker takes which sub-batch can change from run to run, and so can the draws.
  They are not the draws `sampling.py` makes for our model, and they depend on the
  batches. A sampled hypothesis is scored again by teacher forcing (as with a prefix),
  so that its score is the model's log-probability of its tokens, as for our model.
- decode.min_len -> min_decoding_length (EOS forbidden before min_len tokens).
- decode.lenpen: CTranslate2 divides by |y| ** alpha (|y| without EOS), search.py by
  GNMT's ((5 + |y|) / 6) ** alpha (|y| with EOS). Neither search looks at the penalty
  while it runs (live beams are ranked by their sums of log-probabilities; the penalty
  only orders finished hypotheses), so we take CTranslate2's K finished hypotheses with
  their plain sums and apply GNMT's penalty ourselves: the ranking is ours.
- length_penalty is therefore 0 for greedy and 1e-6 for beam: with exactly 0,
  CTranslate2 ends a sentence's beam search once its best candidate is EOS and it holds
  num_hypotheses; search.py (fairseq's rule) goes on until K hypotheses have finished.
  1e-6 turns that exit off, leaving "K finished" as the rule, and |y| ** 1e-6 is
  multiplied back out of the scores.
- max_input_length = the model's max_positions: a longer sentence reaches the model in
  pieces cut at clauses, then words (`sentences.segment`), as for our model; CTranslate2
  refuses positions past the stored table.
- decode.precision does not apply: the weights' type is the export's quantization (the
  Translator's compute_type "default"); decode.batch_tokens batches as for our model.

What is not the same (tests/deploy/test_ct2_export.py checks the rest):
- min_len: CTranslate2 masks EOS before its softmax, so during the first min_len steps
  the other tokens' log-probabilities are renormalised; search.py scores them with the
  model's own probabilities. A hypothesis then scores ours - sum over t < min_len of
  log(1 - p_t(EOS)). With min_len=1 (the default) that is one number per sentence,
  -log(1 - p(EOS | <s>)), the same for all its hypotheses: the same search, scores higher
  by that much (and GNMT ranking, which divides it by lengths, can in principle change
  where it is large). With min_len >= 2 it differs between beams and can change the search.
- Beam search at the length limit: at its last step CTranslate2 finishes its K best
  candidates as they are (any token), search.py extends its K live beams by a forced
  EOS. Sentences whose search reaches the limit can end with different hypotheses.
- When more than K hypotheses have finished by the step at which the K-th finishes,
  CTranslate2 keeps the K best, search.py the first K (earlier steps first): the
  n-best lists can differ there, and the best too where search.py dropped a better one.
- A generated <pad>: our decoder takes it for padding (masked), CTranslate2 for a token.
  A trained model never writes it (it is never a target); a random one can.
Greedy search is the same in tokens and scores (min_len's renormalisation aside).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from transformer.config import ConfigError, DecodeConfig, ModelConfig
from transformer.data.tokenizer import TOKENIZER_FILE, Tokenizer
from transformer.decoding.search import Hypothesis, length_penalty, max_lengths

EXPORT_INFO = "export.json"  # what mt-export adds beside CTranslate2's files
CT2_FILES = ("model.bin", "config.json", "shared_vocabulary.json")
DEFAULT_CPU_THREADS = 2
# On a CPU the threads run as that many single-threaded workers (CTranslate2's inter_threads)
# on sub-batches of this many source tokens, which decodes faster on a 2-core CPU than one
# 2-thread worker on the same or larger batches (docs/results/code-figures.md has
# the figures).
CPU_SUB_BATCH_TOKENS = 500
NO_EARLY_EXIT = 1e-6  # a beam length_penalty that turns CTranslate2's early exit off


def _width_and_lenpen(cfg: DecodeConfig) -> tuple[int, float]:
    """CTranslate2's beam size and length_penalty for `cfg`: the search is unnormalised
    (scores are re-ranked with our length penalty afterwards), but a beam needs a tiny
    penalty to turn early exit off."""
    k = cfg.beam_size if cfg.method == "beam" else 1
    return k, NO_EARLY_EXIT if k > 1 else 0.0


def require_ctranslate2(what: str):
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(f"{what} needs ctranslate2, an optional dependency: "
                          "pip install -e \".[export]\"") from None
    return ctranslate2


def is_export(path: str | Path) -> bool:
    """Whether `path` is a directory written by mt-export."""
    return (Path(path) / EXPORT_INFO).is_file()


def load_export_info(path: str | Path) -> dict:
    """export.json of an export: {model, checkpoint, quantization, ctranslate2}."""
    f = Path(path) / EXPORT_INFO
    try:
        info = json.loads(f.read_text())
        ModelConfig.from_dict(info["model"])
        return info
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, OSError) as e:
        raise ConfigError(f"corrupt or unreadable {f}: {e}") from e


def export_device(pref: str) -> torch.device:
    """The device CTranslate2 runs on: auto is CUDA where this build sees a GPU."""
    ct2 = require_ctranslate2("an exported model")
    gpus = ct2.get_cuda_device_count()
    if pref == "auto":
        return torch.device("cuda:0" if gpus else "cpu")
    device = torch.device(pref)
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={pref}: an exported model runs on cpu or cuda")
    if device.type == "cuda" and (device.index or 0) >= gpus:
        raise ConfigError(f"device={pref}: this ctranslate2 sees {gpus} CUDA device(s)")
    return device


def load_export(path: str | Path, device_pref: str = "auto", threads: int | None = None):
    """(CT2Model, tokenizer, device) from an export directory, as
    `loading.load_for_inference` gives them for a checkpoint."""
    device = export_device(device_pref)
    model = CT2Model(path, device, threads)
    tokenizer = Tokenizer.load(Path(path) / TOKENIZER_FILE)
    if [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)] != model.pieces:
        raise ConfigError(f"{Path(path) / TOKENIZER_FILE} does not hold the pieces of the export's "
                          "vocabulary: the tokenizer does not belong to it")
    return model, tokenizer, device


class CT2Model:
    """An export in a `ctranslate2.Translator`, with what `text.translate_nbest` needs:
    `cfg` (the ModelConfig), `device` and `search(src_ids, cfg)`; `score` teacher-forces.

    threads: on a CPU, that many single-threaded workers (None: 2), each translating a
    sub-batch of CPU_SUB_BATCH_TOKENS source tokens; on CUDA, CTranslate2's defaults.
    """

    def __init__(self, path: str | Path, device: torch.device | str = "cpu",
                 threads: int | None = None) -> None:
        ct2 = require_ctranslate2("an exported model")
        self.path = Path(path)
        for name in CT2_FILES:
            if not (self.path / name).is_file():
                raise ConfigError(f"export {self.path} is missing {name}")
        info = load_export_info(self.path)
        self.cfg = ModelConfig.from_dict(info["model"])
        self.quantization = info["quantization"]
        self.device = torch.device(device)
        if threads is None:
            threads = DEFAULT_CPU_THREADS if self.device.type == "cpu" else 0
        self.threads = threads
        on_cpu = self.device.type == "cpu"
        self.sub_batch = CPU_SUB_BATCH_TOKENS if on_cpu else 0  # 0: the whole call at once
        try:
            self.translator = self._translator()
            self.pieces: list[str] = json.loads((self.path / "shared_vocabulary.json").read_text())
        except (RuntimeError, ValueError, OSError) as e:  # a truncated model.bin, a damaged or missing file
            raise ConfigError(f"export {self.path} is corrupt or incomplete ({' '.join(str(e).split())}): "
                              "export the checkpoint again with mt-export") from None
        self._sampling: tuple[int, object] | None = None  # (seed, its translator): `_engine`
        self.piece_ids = {piece: i for i, piece in enumerate(self.pieces)}
        workers = f"{threads} workers x 1 thread" if on_cpu else f"{threads or 'default'} threads"
        self.engine = f"ctranslate2 {ct2.__version__}, {self.translator.compute_type}, {workers}"

    def _translator(self):
        """A `ctranslate2.Translator` of the export: on a CPU `threads` single-threaded workers."""
        ct2 = require_ctranslate2("an exported model")
        on_cpu = self.device.type == "cpu"
        return ct2.Translator(str(self.path), device=self.device.type,
                              device_index=self.device.index or 0, compute_type="default",
                              inter_threads=self.threads if on_cpu else 1,
                              intra_threads=1 if on_cpu else self.threads)

    def _engine(self, cfg: DecodeConfig):
        """The translator that runs `cfg`: for sampling, one made after
        `ctranslate2.set_random_seed(cfg.seed)` (a worker seeds its generator once, when
        it starts) and kept for later calls with that seed, whose draws continue its streams."""
        if cfg.method != "sample":
            return self.translator
        if self._sampling is None or self._sampling[0] != cfg.seed:
            require_ctranslate2("an exported model").set_random_seed(cfg.seed)
            self._sampling = (cfg.seed, self._translator())
        return self._sampling[1]

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids if i != self.cfg.pad_id]

    def score(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target's tokens and its final EOS.

        src: source ids (no BOS/EOS); tgt: target ids (no BOS/EOS); decoding starts at <s>.
        """
        found = self.translator.score_batch([self._pieces(s) for s in src],
                                            [self._pieces(t) for t in tgt],
                                            max_input_length=self.cfg.max_positions)
        return [list(r.log_probs) for r in found]

    def log_probs(self, src: list[list[int]], tgt: list[list[int]], min_len: int = 0) -> list[list[float]]:
        """`score`'s log-probabilities as this export's search counts them: each token step
        t < min_len renormalised by -log(1 - p(EOS | y_<t)) (CTranslate2 masks EOS before
        its softmax there; `scoring.py`)."""
        found = self.score(src, tgt) if src else []
        for t in range(min_len):
            rows = [i for i, ids in enumerate(tgt) if len(ids) > t]
            if not rows:
                break
            eos = self.score([src[i] for i in rows], [tgt[i][:t] for i in rows])
            for i, lp in zip(rows, eos, strict=True):
                found[i][t] -= math.log1p(-math.exp(min(lp[-1], -1e-12)))
        return found

    def search(self, src_ids: torch.Tensor, cfg: DecodeConfig,
               prefixes: list[list[int] | None] | None = None) -> list[list[Hypothesis]]:
        """src_ids (B, S) -> n-best lists, as `search.search` gives them for our model;
        prefixes: None, or per sentence the ids its output starts with (CTranslate2's
        target_prefix; cfg.no_repeat_ngram_size is its option of that name too). With
        either, each hypothesis is scored again by teacher forcing (`log_probs`), since
        CTranslate2 leaves a prefix's tokens out of its score and renormalises around
        banned n-grams: so its score is what `Translator.score` gives, as for our model."""
        if src_ids.size(1) > self.cfg.max_positions:
            raise ValueError(f"sequence of {src_ids.size(1)} tokens exceeds model "
                             f"max_positions={self.cfg.max_positions}")
        limits = max_lengths(self, src_ids, cfg.max_len_a, cfg.max_len_b, cfg.min_len).tolist()
        src = src_ids.tolist()
        results: list[list[Hypothesis]] = [[] for _ in src]
        groups = []  # one max_decoding_length per call; all calls submitted before any is awaited
        for limit in sorted(set(limits)):
            rows = [i for i, n in enumerate(limits) if n == limit]
            prefix = [prefixes[i] for i in rows] if prefixes is not None else None
            groups.append((rows, limit, self._submit([src[i] for i in rows], limit, cfg, prefix)))
        for rows, limit, pending in groups:
            found = [p.result() for p in pending]
            exact = prefixes is not None or cfg.no_repeat_ngram_size > 0 or cfg.method == "sample"
            for i, hyps in zip(rows, self._nbest([src[i] for i in rows], found, limit, cfg, exact),
                               strict=True):
                results[i] = hyps
        return results

    def _submit(self, src: list[list[int]], limit: int, cfg: DecodeConfig,
                prefix: list[list[int] | None] | None = None) -> list:
        """Start translating sentences that share the length limit (asynchronously, in
        sub-batches the workers share)."""
        k, lp = _width_and_lenpen(cfg)
        target_prefix = None if prefix is None else [self._pieces(p) if p else None for p in prefix]
        sampling = {} if cfg.method != "sample" else {
            "sampling_topk": cfg.sampling_topk, "sampling_topp": cfg.sampling_topp,
            "sampling_temperature": cfg.sampling_temperature}
        return self._engine(cfg).translate_batch(
            [self._pieces(s) for s in src], target_prefix, beam_size=k, **sampling,
            no_repeat_ngram_size=cfg.no_repeat_ngram_size, num_hypotheses=k, length_penalty=lp,
            max_decoding_length=limit, min_decoding_length=cfg.min_len,
            max_input_length=self.cfg.max_positions, return_scores=True,
            max_batch_size=self.sub_batch, batch_type="tokens", asynchronous=True)

    def _nbest(self, src: list[list[int]], found: list, limit: int, cfg: DecodeConfig,
               exact: bool = False) -> list[list[Hypothesis]]:
        """CTranslate2's results for sentences that share the length limit -> n-best lists
        (exact: every hypothesis scored again by teacher forcing, `search`)."""
        _, lp = _width_and_lenpen(cfg)
        # (tokens, sum of log-probabilities): CTranslate2 divided the sums by |y| ** lp
        hyps = [[([self.piece_ids[p] for p in h], s * len(h) ** lp)
                 for h, s in zip(r.hypotheses, r.scores, strict=True)] for r in found]
        nbest = cfg.nbest if cfg.method == "beam" else 1

        def normalised(tokens: list[int], total: float) -> float:
            return total / length_penalty(len(tokens) + 1, cfg.lenpen)

        if exact:
            pairs = [(i, t) for i, hs in enumerate(hyps) for t, _ in hs]
            sums = iter(sum(lp) for lp in self.log_probs([src[i] for i, _ in pairs],
                                                         [t for _, t in pairs], cfg.min_len))
            ranked = [sorted((Hypothesis(t, normalised(t, next(sums))) for t, _ in hs),
                             key=lambda h: h.score, reverse=True)[:nbest] for hs in hyps]
            return ranked

        # Close the hypotheses that reached the limit with the EOS search.py would force
        # there, and its log-probability (score_batch). EOS can only lower a score, so
        # those that could not rank among the nbest anyway are dropped unscored. An empty
        # hypothesis (min_len=0) had its sum divided by 0 ** lp: it is scored again too.
        todo = []
        for i, hs in enumerate(hyps):
            ended = sorted((normalised(t, s) for t, s in hs if 0 < len(t) < limit), reverse=True)
            bar = ended[nbest - 1] if len(ended) >= nbest else -math.inf
            todo += [(i, j) for j, (t, s) in enumerate(hs)
                     if not t or (len(t) == limit and normalised(t, s) >= bar)]
        if todo:
            scored = self.score([src[i] for i, _ in todo], [hyps[i][j][0] for i, j in todo])
            for (i, j), log_probs in zip(todo, scored, strict=True):
                tokens, total = hyps[i][j]
                hyps[i][j] = (tokens, (total if tokens else 0.0) + log_probs[-1])
        closed = set(todo)
        ranked = []
        for i, hs in enumerate(hyps):
            kept = [Hypothesis(t, normalised(t, s)) for j, (t, s) in enumerate(hs)
                    if (i, j) in closed or 0 < len(t) < limit]  # or ended with EOS
            kept.sort(key=lambda h: h.score, reverse=True)
            ranked.append(kept[:nbest])
        return ranked
