"""mkdocs hook: publish the committed benchmark results (JSON and PNG) with the site.

The figures live once, in ``benchmarks/results/``, where the benchmarks write them; the
benchmark page includes the JSON through pymdownx.snippets and links the charts under the same
relative path, so nothing is copied into ``docs/`` by hand.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = "benchmarks/results"


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for path in sorted((root / RESULTS).glob("*")):
        if path.suffix in (".png", ".json"):
            files.append(File.generated(config, f"{RESULTS}/{path.name}", abs_src_path=str(path)))
    return files
