"""Every citation of a reference setup (the users' seed 000-003) resolves inside the repository.

Code, presets and the README cite the four reference setups by seed number and section ("seed 003
section 7", "seed 003 sec. 9", "seed 003 §7 Tier 2", "seed 003 sec. 10, \"Answer Extraction
Pipeline\"", "Seed 002's Timing Analysis"). The seeds themselves are not in the repository;
docs/reference-setups.md describes them, with each seed's own section numbering (seed 003) or own
headings (seeds 000-002) kept as headings. This test reads the citations out of the sources and
checks each against the headings of that page, so a citation of a section the page does not have
(a typo, a renumbering, a section the seed never had) fails with its file and line.

What counts as a citation (scanned in rftlib/, params/, scripts/, bench/, notebooks/, tests/ and README.md):

- a seed mention: ``seed 003``, ``Seed 003's``, ``seed003`` (preset names ``seed003-...``, helper names
  ``seed003_...``), ``seed-003``: it must name a seed that exists (000-003);
- a section reference: ``section N``, ``sec. N``, ``§N`` (an integer; ``sec. 3.4`` is a paper's). It
  belongs to the nearest seed mention before it in the same file, unless a paper citation (``et al``,
  ``arXiv``) stands between them; it must resolve to a heading ``Seed 00S §N`` of the page;
  ``§N Tier K`` (also ``Tier 1-3``, ``Tier 2/3``) to a heading ``Seed 00S §N ... Tier K``, and quoted
  names right after it (``sec. 10, "Answer Normalization"``) to a heading ``Seed 00S §N ... <name>``;
- a named heading of a seed without numbered sections: ``Seed 002's Timing Analysis`` (two or more
  capitalised words after the possessive), ``Component Validation (seed 002)``, ``seed 002
  ("Experiment 07: ...")``: a heading ``Seed 00S`` containing that name;
- a preset ``params/seed00S-*.yaml``: named on the page, in seed S's part.

No torch, no network: the test reads text files only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reference-setups.md"
SCANNED = ("rftlib", "params", "scripts", "bench", "notebooks", "tests", "README.md")
SELF = Path(__file__).resolve()  # its planted citations are wrong on purpose
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".ipynb", ".sh", ".mjs", ".toml", ".txt", ".cfg"}
SEEDS = {"000", "001", "002", "003"}

# a word start, also right after a "\n" escape written in a string literal: md("...\n\nSeed 003 section 12")
_B = r"(?:\b|(?<=\\n))"
# "seed 003", "Seed 003's", "seed003-gpt-oss", "seed003_presets", "seed-003"; three digits, so that
# "seed 42" (a random seed) is not one
SEED_RE = re.compile(_B + r"seed[ _-]?(\d{3})(?!\d)", re.I)
# "section 7", "Section 7", "sec. 7", "§7", "§ 7"; not "sec. 3.4" (a paper's decimal section)
SECTION_RE = re.compile(r"(?:§\s?|" + _B + r"sec\.\s?|" + _B + r"section\s)(\d+)(?![.]\d|\d)", re.I)
# right after a section number: "Tier 2", ", Tier 1", " Tier 1-3", " Tier 2/3"
TIER_RE = re.compile(r"[,:]?\s*Tier\s(\d(?:\s?[-/]\s?\d)*)")
# right after a section number: , "Name" and "Name" (the seed's own subsection names)
NAMES_RE = re.compile(r',\s*"([A-Z][^"\n]{2,60})"(?:\s*(?:and|,)\s*"([A-Z][^"\n]{2,60})")*')
NAME_TAIL_RE = re.compile(r'\s*(?:and|,)\s*"([A-Z][^"\n]{2,60})"')
# what separates a seed mention from a paper's section: "Yu et al. 2025, sec. 3.2", "arXiv:2501..., sec. 3"
PAPER_RE = re.compile(r"et al\b|arXiv", re.I)
# "Seed 002's Timing Analysis": two or more capitalised words after the possessive
POSSESSIVE_NAME_RE = re.compile(_B + r"[Ss]eed (\d{3})'s ((?:[A-Z][a-z]+ ){1,5}[A-Z][a-z]+)\b"
                                r"(?: and ((?:[A-Z][a-z]+ ){1,5}[A-Z][a-z]+)\b)?")
# "Component Validation (seed 002)": the two capitalised words before it
CAPTION_NAME_RE = re.compile(r"\b([A-Z][a-z]+ [A-Z][a-z]+) \([Ss]eed (\d{3})\)")
# 'seed 002 ("Experiment 07: GRPO Training Loop Validation")'
TITLE_NAME_RE = re.compile(_B + r'[Ss]eed (\d{3}) \("([^"\n]{3,80})"\)')
HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
PART_RE = re.compile(r"\bSeed (\d{3})\b")


@dataclass(frozen=True)
class Citation:
    """One thing cited: a seed, a seed's section (with a Tier or a subsection name), or a named heading."""

    where: str  # "path:line"
    seed: str  # "003"
    section: int | None = None  # 7 for "section 7"
    sub: str | None = None  # "Tier 2", or a subsection / heading name
    text: str = ""  # the citation as written, for the failure message

    def __str__(self) -> str:
        what = f"seed {self.seed}" + (f" §{self.section}" if self.section is not None else "")
        what += f" / {self.sub!r}" if self.sub else ""
        return f"{self.where}: {what}  (written: {self.text!r})"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _expand_tiers(spec: str) -> list[str]:
    """'2' -> ['Tier 2'], '1-3' -> Tier 1, 2, 3, '2/3' -> Tier 2, 3."""
    parts = [int(p) for p in re.split(r"\s?[-/]\s?", spec)]
    if "-" in spec and len(parts) == 2:
        parts = list(range(parts[0], parts[1] + 1))
    return [f"Tier {p}" for p in parts]


def citations_in(text: str, where: str) -> list[Citation]:
    """The seed, section and named-heading citations in one file's text (``where`` names the file)."""
    out: list[Citation] = []
    seeds = [(m.start(), m.end(), m.group(1)) for m in SEED_RE.finditer(text)]
    for s, _, seed in seeds:
        out.append(Citation(f"{where}:{_line(text, s)}", seed, text=text[s:s + 40].split("\n")[0]))
    for m in SECTION_RE.finditer(text):
        before = [t for t in seeds if t[1] <= m.start()]
        if not before:
            continue  # no seed mentioned before it in this file: a paper's or this repository's own section
        s, e, seed = before[-1]
        if PAPER_RE.search(text, e, m.start()):
            continue  # a paper's section: "DeepSeekMath, Shao et al. 2024, sec. 4.1.2"
        where_m = f"{where}:{_line(text, m.start())}"
        shown = text[m.start():m.end() + 30].split("\n")[0]
        sec = int(m.group(1))
        out.append(Citation(where_m, seed, sec, text=shown))
        t = TIER_RE.match(text, m.end())
        if t:
            out += [Citation(where_m, seed, sec, tier, shown) for tier in _expand_tiers(t.group(1))]
        n = NAMES_RE.match(text, m.end())
        if n:
            names, pos = [n.group(1)], text.index(n.group(1), m.end()) + len(n.group(1)) + 1
            while (more := NAME_TAIL_RE.match(text, pos)):
                names.append(more.group(1))
                pos = more.end()
            out += [Citation(where_m, seed, sec, name, shown) for name in names]
    for rx, seed_group, name_groups in ((POSSESSIVE_NAME_RE, 1, (2, 3)), (CAPTION_NAME_RE, 2, (1,)),
                                        (TITLE_NAME_RE, 1, (2,))):
        for m in rx.finditer(text):
            out += [Citation(f"{where}:{_line(text, m.start())}", m.group(seed_group), None, m.group(g), m.group(0))
                    for g in name_groups if m.group(g)]
    return out


def scanned_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        p = root / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES and f.resolve() != SELF
                            and ".ipynb_checkpoints" not in f.parts and "__pycache__" not in f.parts)
    return files


def all_citations(root: Path = ROOT) -> list[Citation]:
    out: list[Citation] = []
    for f in scanned_files(root):
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".ipynb":  # cells are JSON strings: a quote inside one is written \" (one line per line)
            text = text.replace('\\"', '"')
        out += citations_in(text, str(f.relative_to(root)))
    return out


@dataclass(frozen=True)
class Heading:
    line: int
    level: int
    text: str
    seed: str | None  # the seed part it lies in ("## Seed 003 ..." and everything under it)


def doc_headings(doc_text: str) -> list[Heading]:
    """The page's headings, each with the seed part it lies in (a level-2 heading naming one seed opens a part)."""
    out: list[Heading] = []
    part: str | None = None
    for m in HEADING_RE.finditer(doc_text):
        level, text = len(m.group(1)), m.group(2)
        if level <= 2:
            seeds = PART_RE.findall(text)
            part = seeds[0] if level == 2 and len(set(seeds)) == 1 else None
        out.append(Heading(_line(doc_text, m.start()), level, text, part))
    return out


def resolves(c: Citation, headings: list[Heading]) -> bool:
    """True when a heading of seed ``c.seed``'s part is the cited section / subsection / named heading."""
    mine = [h for h in headings if h.seed == c.seed]
    if c.section is None and c.sub is None:
        return any(h.level == 2 for h in mine)  # the seed has a part of its own
    if c.section is not None:
        sec = re.compile(rf"\bSeed {c.seed} §{c.section}(?!\d)")
        mine = [h for h in mine if sec.search(h.text)]
    else:
        mine = [h for h in mine if re.search(rf"\bSeed {c.seed}\b", h.text)]
    if c.sub is None:
        return bool(mine)
    sub = c.sub.lower()
    if sub.startswith("tier "):
        return any(re.search(rf"\b{sub}(?!\d)", h.text.lower()) for h in mine)
    return any(sub in h.text.lower() for h in mine)


def unresolved(citations: list[Citation], doc_text: str) -> list[Citation]:
    headings = doc_headings(doc_text)
    bad = [c for c in citations if c.seed not in SEEDS]
    return bad + [c for c in citations if c.seed in SEEDS and not resolves(c, headings)]


# ---- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc_text() -> str:
    assert DOC.is_file(), f"{DOC.relative_to(ROOT)} is missing: the reference setups that code and presets cite"
    return DOC.read_text(encoding="utf-8")


def test_every_seed_citation_resolves_to_a_heading(doc_text):
    cites = all_citations()
    # the scan found the citation forms the code uses (a scan that found nothing would pass vacuously)
    assert sum(c.section is not None for c in cites) >= 100, "the scan found too few section citations"
    assert {c.seed for c in cites} >= SEEDS
    bad = unresolved(cites, doc_text)
    assert not bad, ("citations that resolve to no heading of docs/reference-setups.md (cite an existing "
                     "seed 000-003 and a section the page has):\n" + "\n".join(map(str, bad)))


def test_each_seed_has_a_part_and_each_numbered_section_a_heading(doc_text):
    """Seed 003's sections 1-13 each have a heading, whether or not something cites them yet."""
    headings = doc_headings(doc_text)
    for seed in sorted(SEEDS):
        assert resolves(Citation("doc", seed), headings), f"no '## Seed {seed} ...' part"
    missing = [n for n in range(1, 14) if not resolves(Citation("doc", "003", n), headings)]
    assert not missing, f"seed 003 sections without a heading 'Seed 003 §N': {missing}"


def test_every_seed_preset_is_described_in_its_seed_part(doc_text):
    headings = doc_headings(doc_text)
    lines = doc_text.splitlines()
    presets = sorted((ROOT / "params").glob("seed*.yaml"))
    assert len(presets) >= 10
    missing = []
    for p in presets:
        seed = re.match(r"seed(\d{3})-", p.name)
        assert seed and seed.group(1) in SEEDS, f"params/{p.name}: a preset named after no seed 000-003"
        # the lines of that seed's part
        starts = [h.line for h in headings if h.level == 2 and h.seed == seed.group(1)]
        ends = [h.line for h in headings if h.level <= 2 and starts and h.line > starts[0]]
        part = "\n".join(lines[starts[0] - 1:(ends[0] - 1 if ends else None)]) if starts else ""
        if p.stem not in part:
            missing.append(p.name)
    assert not missing, f"presets not named in their seed's part of the page: {missing}"


# ---- the checker checks itself: planted citations it must refuse or accept -------------------------

_DOC = """# Reference setups
## Seed 002 — FizzBuzz loop validation
### Seed 002 — Timing Analysis
## Seed 003 — gpt-oss GRPO
### Seed 003 §7 Metrics
#### Seed 003 §7 Tier 2 — stability diagnostics
### Seed 003 §10 Reward function
#### Seed 003 §10 Answer Extraction Pipeline
## Elsewhere
### Seed 003 §9 (outside seed 003's part: does not count)
"""


@pytest.mark.parametrize("src, ok", [
    ("x = 1  # seed 003 section 7", True),
    ("x = 1  # seed 003 sec. 7", True),
    ("x = 1  # (seed 003 §7 Tier 2)", True),
    ("x = 1  # (seed 003 §7, §10)", True),
    ('"""seed 003 sec. 10, "Answer Extraction Pipeline")"""', True),
    ("# Seed 003's gpt-oss-120b column (section 7)", True),
    ("# Seed 002's Timing Analysis", True),
    ("# seed 002 lists no sections, seed 003 does", True),
    # a paper's sections after a seed mention are not the seed's
    ("# seed 003 uses DeepSeekMath's advantage (Shao et al. 2024, sec. 4.1.2; also DAPO, Yu et al., sec. 14)", True),
    ("x = 1  # seed 003 section 9", False),  # §9's heading lies outside seed 003's part
    ("x = 1  # seed 003 §14", False),  # no such section
    ("x = 1  # seed 003 §17)", False),
    ("x = 1  # seed 002 section 7", False),  # seed 002 has no numbered sections
    ("x = 1  # seed 003 §7 Tier 3", False),  # §7 has no Tier 3 heading here
    ('"""seed 003 sec. 10, "Answer Normalization")"""', False),
    ("# Seed 002's Memory Usage", False),
    ("# seed 004 defaults", False),  # no such seed
    ("name: seed005-anything", False),
    (r'md("## Format compliance\n\nSeed 003 §14: below 95%")', False),  # after a "\n" escape in a literal
    (r'md("## Format compliance\n\nSeed 003 §10: exact match")', True),
])
def test_checker_on_planted_citations(src, ok):
    cites = citations_in(src, "planted.py")
    assert cites, f"no citation found in {src!r}"
    bad = unresolved(cites, _DOC)
    assert (not bad) == ok, f"{src!r}: unresolved {[str(b) for b in bad]}"


def test_checker_binds_a_section_to_the_nearest_seed_before_it():
    text = "seed 002 lists no sections.\n\nseed 003 does: section 7\nand later, its section 10"
    secs = [(c.seed, c.section) for c in citations_in(text, "t") if c.section is not None]
    assert secs == [("003", 7), ("003", 10)]
    # a section with no seed before it in the file is not a seed citation
    assert [c for c in citations_in("see section 7 below; seed 003", "t") if c.section is not None] == []
