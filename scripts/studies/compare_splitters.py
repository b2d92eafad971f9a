"""Italian sentence splitters side by side: hand-written cases, joined dev sets, speed.

    pip install pysbd sentencex           # the candidates the project does not depend on
    python scripts/studies/compare_splitters.py [--max-lines 2000]

Candidates: the Moses splitter (`sentence-splitter`) with its own Italian prefixes and
with the project's additions (`transformer.data.sentences`, what mt-translate uses), `sentencex`,
`pysbd`, and spaCy's rule-based sentencizer on a blank Italian pipeline as the Argos
package loads it, without and with the project's prefixes as tokenizer special cases
(`transformer.deploy.argos.sentencizer`). Three measures:

1. CASES: Italian text with abbreviations (`Sig.`, `ecc.`, `p. es.`, `Dott.`, `art. 3`),
   numbers (`3.5`, `1.000`), quotes, ellipses, question and exclamation marks, whose right
   split is written by hand: how many each candidate splits exactly so.
2. Joined dev sets: consecutive lines of europarl/dev, tatoeba/dev and FLORES-200 devtest
   joined 2 to 5 at a time (`scripts/studies/paragraphs.py`, seed 0): the share of joins found
   again (recall), the share of paragraphs split exactly into their lines, and the cuts
   made inside a line per 100 lines (some right: a Tatoeba line can hold two sentences).
3. Speed: paragraphs per second (one thread; whatever the CPU), and the share of
   paragraphs each candidate splits exactly as mt-translate does (the Argos package's
   agreement with mt-translate).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from transformer.config import DataConfig
from transformer.data.corpus import read_lines
from transformer.device import describe_cpu
from transformer.paths import project_path

from paragraphs import join_groups, paragraph_groups

# (text, its sentences)
CASES: list[tuple[str, list[str]]] = [
    ("Il Sig. Rossi è arrivato. Ora parla.", ["Il Sig. Rossi è arrivato.", "Ora parla."]),
    ("Compro mele, pere ecc. al mercato. Poi torno.",
     ["Compro mele, pere ecc. al mercato.", "Poi torno."]),
    ("Porta della frutta, p. es. mele o pere. Grazie.",
     ["Porta della frutta, p. es. mele o pere.", "Grazie."]),
    ("Il Dott. Bianchi la aspetta. Entri pure.", ["Il Dott. Bianchi la aspetta.", "Entri pure."]),
    ("Il tasso è salito al 3.5 per cento. È troppo.",
     ["Il tasso è salito al 3.5 per cento.", "È troppo."]),
    ("C'erano 1.000 persone in piazza. Troppe.", ["C'erano 1.000 persone in piazza.", "Troppe."]),
    ("Il treno parte alle 10.30 in punto. Non tardare.",
     ["Il treno parte alle 10.30 in punto.", "Non tardare."]),
    ('Disse: "Vengo domani." Poi uscì.', ['Disse: "Vengo domani."', "Poi uscì."]),
    ("«Andiamo», disse. «Subito!» Nessuno si mosse.",
     ["«Andiamo», disse.", "«Subito!»", "Nessuno si mosse."]),
    ("Aspetta... Non andare via!", ["Aspetta...", "Non andare via!"]),
    ("Non so... forse domani.", ["Non so... forse domani."]),
    ("Che ore sono? Sono le tre.", ["Che ore sono?", "Sono le tre."]),
    ("Vieni qui! Subito.", ["Vieni qui!", "Subito."]),
    ("L'on. Prodi ha parlato a lungo. Tutti hanno applaudito.",
     ["L'on. Prodi ha parlato a lungo.", "Tutti hanno applaudito."]),
    ("Secondo l'art. 3 del Trattato la Commissione decide. Il Consiglio approva.",
     ["Secondo l'art. 3 del Trattato la Commissione decide.", "Il Consiglio approva."]),
    ("Il 12 dic. 2000 fu firmata la Carta. Era a Nizza.",
     ["Il 12 dic. 2000 fu firmata la Carta.", "Era a Nizza."]),
    ("Vedi pag. 12 del documento. Grazie.", ["Vedi pag. 12 del documento.", "Grazie."]),
    ("La Sig.ra Bianchi è qui. Vuole parlarle.", ["La Sig.ra Bianchi è qui.", "Vuole parlarle."]),
    ("Il prof. Neri insegna fisica. Lo ascoltiamo.",
     ["Il prof. Neri insegna fisica.", "Lo ascoltiamo."]),
    ("Sono nato nel 1990. Vivo a Roma.", ["Sono nato nel 1990.", "Vivo a Roma."]),
    ("Signor Presidente, la ringrazio. Passiamo al punto successivo.",
     ["Signor Presidente, la ringrazio.", "Passiamo al punto successivo."]),
    ("Ho visto il film (bellissimo). Poi sono uscito.",
     ["Ho visto il film (bellissimo).", "Poi sono uscito."]),
    ("Il sito www.comune.roma.it è chiuso. Riprova domani.",
     ["Il sito www.comune.roma.it è chiuso.", "Riprova domani."]),
    ("Ecco: uno, due, tre. Fatto.", ["Ecco: uno, due, tre.", "Fatto."]),
    ("Tom è qui. Mary no.", ["Tom è qui.", "Mary no."]),
    ("Vieni anche tu? Io no. Resto a casa.", ["Vieni anche tu?", "Io no.", "Resto a casa."]),
    ("Lo scrisse J. R. R. Tolkien. È un classico.", ["Lo scrisse J. R. R. Tolkien.", "È un classico."]),
    ("Ne ho mangiati 3. Erano buoni.", ["Ne ho mangiati 3.", "Erano buoni."]),
    ("L'UE, cioè l'Unione europea, decide. Gli Stati membri eseguono.",
     ["L'UE, cioè l'Unione europea, decide.", "Gli Stati membri eseguono."]),
]
DEV_SETS = {"europarl/dev": "europarl/dev.it", "tatoeba/dev": "tatoeba/dev.it",
            "flores200-devtest": "eval/flores200-devtest.it"}


def candidates() -> dict[str, Callable[[str], list[str]]]:
    """name -> split function; a candidate whose library is missing is left out."""
    from sentence_splitter import SentenceSplitter

    from transformer.data.sentences import split_sentences
    from transformer.deploy.argos import sentencizer

    out: dict[str, Callable[[str], list[str]]] = {
        "moses (sentence-splitter 1.4, its Italian prefixes)": SentenceSplitter("it").split,
        "moses + our prefixes (transformer.data.sentences)": split_sentences,
    }
    try:
        import sentencex

        out["sentencex"] = lambda t: list(sentencex.segment("it", t))
    except ImportError:
        pass
    try:
        import pysbd

        out["pysbd"] = pysbd.Segmenter(language="it", clean=False).segment
    except ImportError:
        pass
    for name, nlp in (("spaCy sentencizer, blank it (Argos package before)", sentencizer(False)),
                      ("spaCy sentencizer + our prefixes (Argos package now)", sentencizer(True))):
        out[name] = lambda t, nlp=nlp: [s.text for s in nlp(t).sents]
    return out


def clean(sentences: list[str]) -> list[str]:
    return [s.strip() for s in sentences if s.strip()]


def boundaries(sentences: list[str]) -> set[int]:
    """Character offsets (spaces removed) where each sentence but the first starts."""
    out, pos = set(), 0
    for s in sentences[:-1]:
        pos += len("".join(s.split()))
        out.add(pos)
    return out


def dev_scores(split: Callable[[str], list[str]], lines: list[str]) -> tuple[float, ...]:
    """(join recall %, paragraphs exact %, cuts inside lines per 100 lines, paragraphs/s,
    paragraphs split as transformer.data.sentences splits them %)."""
    from transformer.data.sentences import split_sentences

    groups = paragraph_groups(len(lines), 2, 5, seed=0)
    paragraphs = join_groups(lines, groups)
    found = joins = exact = inside = 0
    start = time.perf_counter()
    outs = [clean(split(p)) for p in paragraphs]
    seconds = time.perf_counter() - start
    same = sum(boundaries(o) == boundaries(split_sentences(p)) for o, p in zip(outs, paragraphs, strict=True))
    for group, out in zip(groups, outs, strict=True):
        truth = boundaries([lines[i] for i in group])
        got = boundaries(out)
        joins += len(truth)
        found += len(truth & got)
        inside += len(got - truth)
        exact += got == truth
    return (100 * found / joins, 100 * exact / len(groups), 100 * inside / len(lines),
            len(paragraphs) / seconds, 100 * same / len(groups))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-lines", type=int, default=2000, help="lines of each dev set")
    args = parser.parse_args()
    root = project_path(DataConfig().root)
    sets = {name: [line for line in read_lines(Path(root) / path)[: args.max_lines] if line.strip()]
            for name, path in DEV_SETS.items()}
    print(f"CPU: {describe_cpu()}")
    for name, split in candidates().items():
        right = [clean(split(text)) == want for text, want in CASES]
        wrong = [text for (text, _), ok in zip(CASES, right, strict=True) if not ok]
        print(f"\n{name}\n  cases: {sum(right)}/{len(CASES)} right")
        for text in wrong:
            print(f"    wrong: {text!r} -> {clean(split(text))!r}")
        for set_name, lines in sets.items():
            recall, exact, inside, speed, same = dev_scores(split, lines)
            print(f"  {set_name}: joins found {recall:.1f}%, paragraphs exact {exact:.1f}%, "
                  f"cuts inside lines {inside:.1f}/100 lines, {speed:,.0f} paragraphs/s, "
                  f"split as mt-translate splits {same:.1f}%")


if __name__ == "__main__":
    main()
