#!/usr/bin/env python3
"""What headless Chromium saw of a commtap HTML report (tests/src/browser.rs).

Usage: html_page.py DOM.html NETLOG.json...

Prints JSON: `tables` by class (rows of cell texts), `figures` by id ({caption, svg, fills: {"#RRGGBB": rects}, circles, texts,
legend: [fills]}), `sections` (ids), `scripts` (count), `handlers` (on* attributes),
`references` (every src/href/url(...) in the DOM), `requests` (URLs other than file: ones
the page asked for, from the network logs). Standard library only: the DOM is Chromium's serialisation.
"""

import json
import re
import sys
from html.parser import HTMLParser

URL_ATTRS = {"src", "href", "xlink:href", "action", "poster", "srcset", "data", "background"}


class Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.figures = {}
        self.sections = []
        self.scripts = 0
        self.handlers = []
        self.references = []
        self.figure = None
        self.in_text = False
        self.in_caption = False
        self.in_style = False
        self.tables = {}
        self.table = None
        self.cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"{tag} {name}")
            if name in URL_ATTRS and value is not None:
                self.references.append(value)
            if name == "style" and value and "url(" in value:
                self.references.extend(re.findall(r"url\(([^)]*)\)", value))
        if tag == "table":
            self.table = self.tables.setdefault(a.get("class") or "", [])
        elif self.table is not None and tag == "tr":
            self.table.append([])
        elif self.table is not None and tag in ("td", "th") and self.table:
            self.table[-1].append("")
            self.cell = True
        if tag == "script":
            self.scripts += 1
        elif tag == "style":
            self.in_style = True
        elif tag == "section" and "id" in a:
            self.sections.append(a["id"])
        elif tag == "figure" and "chart" in (a.get("class") or "").split():
            self.figure = {
                "caption": "",
                "svg": False,
                "fills": {},
                "circles": 0,
                "texts": [],
                "legend": [],
            }
            self.figures[a.get("id", "")] = self.figure
        elif self.figure is not None:
            f = self.figure
            if tag == "svg":
                f["svg"] = True
            elif tag == "rect":
                fill = (a.get("fill") or "").upper()
                f["fills"][fill] = f["fills"].get(fill, 0) + 1
            elif tag == "circle":
                f["circles"] += 1
            elif tag == "text":
                self.in_text = True
                f["texts"].append("")
            elif tag == "figcaption":
                self.in_caption = True
            elif tag == "span" and "swatch" in (a.get("class") or "").split():
                f["legend"].append((a.get("data-fill") or "").upper())

    def handle_endtag(self, tag):
        if tag == "table":
            self.table = None
        elif tag in ("td", "th"):
            self.cell = None
        if tag == "figure":
            self.figure = None
        elif tag == "text":
            self.in_text = False
        elif tag == "figcaption":
            self.in_caption = False
        elif tag == "style":
            self.in_style = False

    def handle_data(self, data):
        if self.cell and self.table:
            self.table[-1][-1] += data.strip()
        if self.in_style and "url(" in data:
            self.references.extend(re.findall(r"url\(([^)]*)\)", data))
        if self.figure is None:
            return
        if self.in_text:
            self.figure["texts"][-1] += data.strip()
        elif self.in_caption:
            self.figure["caption"] += data


def requests(path):
    """URLs the page asked for: URL requests with an initiator. Chromium's own background
    requests (time, component updates, accounts) have none ("not an origin")."""
    with open(path) as f:
        text = f.read().strip()
    # A log Chromium did not close is still its events so far.
    if not text.endswith("}"):
        text = text.rstrip(",\n") + "]}"
    log = json.loads(text)
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    found = set()
    for e in log.get("events", []):
        p = e.get("params") or {}
        if e.get("type") == start and p.get("initiator") != "not an origin":
            url = p.get("url", "")
            if url and not url.startswith("file:"):
                found.add(url)
    return sorted(found)


def main():
    dom, logs = sys.argv[1], sys.argv[2:]
    page = Page()
    with open(dom, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    found = sorted({u for log in logs for u in requests(log)})
    print(
        json.dumps(
            {
                "figures": page.figures,
                "sections": page.sections,
                "tables": page.tables,
                "scripts": page.scripts,
                "handlers": page.handlers,
                "references": page.references,
                "requests": found,
            }
        )
    )


if __name__ == "__main__":
    main()
