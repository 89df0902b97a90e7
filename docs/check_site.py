"""Checks the built docs site in a real browser (headless Chromium) and crawls it for broken internal links.

    mkdocs build --strict && python docs/check_site.py          # screenshots in site-check/

1. Serves `site/` on 127.0.0.1 (a free port) with Python's http.server, recording every request and its status.
2. Crawls every HTML file of `site/` for href/src targets on the site and fails on one that does not exist
   (file, or directory with index.html; `#anchors` must exist as an id in the target page).
3. Opens the home page, a guide page, an API page, a results page and a notebook in headless Chromium
   (`chromium`, Debian's package: `apt-get install chromium`), saves a screenshot of each under `site-check/`,
   dumps each page's DOM and checks that its content rendered; fails on a JavaScript error (console messages
   logged to stderr by `--enable-logging=stderr`), on a page or asset the browser requested that the server did
   not have (404), or on a missing page.
4. First, a self-test: a page that throws must be reported, so a browser whose logging changed cannot pass
   silently.

Exit status 0 when everything passed, 1 otherwise (with one line per problem on stderr).
"""

import argparse
import functools
import html.parser
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (url path, what must appear in the rendered DOM)
PAGES = [("index.html", "gkl-jax", "home"),
         ("guide/models/index.html", "Writing a", "guide-models"),
         ("api/factors/index.html", "gkl_jax.factors.Chevron", "api-factors"),
         ("results/tables-2-4/index.html", "Tables 2-4", "results-tables-2-4"),
         ("notebooks/01_quickstart/index.html", "Quickstart", "notebook-01")]
JS_ERROR = re.compile(r"CONSOLE.*(Uncaught|Error|error|Failed to load resource)|Uncaught ")


class LinkParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            if name in ("id", "name") and value:
                self.ids.add(value)


def parse(path):
    parser = LinkParser()
    with open(path, encoding="utf-8", errors="replace") as fh:
        parser.feed(fh.read())
    return parser


def resolve(site, page, link):
    """The file a link of `page` points to inside `site` and its fragment, or None for an external link."""
    parts = urllib.parse.urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
        return None
    if not parts.path:
        return page, urllib.parse.unquote(parts.fragment)
    base = site if parts.path.startswith("/") else os.path.dirname(page)
    target = os.path.normpath(os.path.join(base, urllib.parse.unquote(parts.path).lstrip("/")))
    if os.path.isdir(target):
        target = os.path.join(target, "index.html")
    return target, urllib.parse.unquote(parts.fragment)


def crawl(site):
    """Broken internal links of every HTML page: ['page -> link (why)']."""
    problems, ids = [], {}
    pages = [os.path.join(d, f) for d, _, fs in os.walk(site) for f in fs if f.endswith(".html")]
    for page in pages:
        for link in parse(page).links:
            hit = resolve(site, page, link)
            if hit is None:
                continue
            target, fragment = hit
            rel = os.path.relpath(page, site)
            if not target.startswith(os.path.abspath(site)) and not os.path.abspath(target).startswith(
                    os.path.abspath(site)):
                problems.append(f"{rel} -> {link} (outside the site)")
            elif not os.path.exists(target):
                problems.append(f"{rel} -> {link} (missing)")
            elif fragment and target.endswith(".html"):
                if target not in ids:
                    ids[target] = parse(target).ids
                if fragment not in ids[target]:
                    problems.append(f"{rel} -> {link} (no id {fragment!r})")
    return problems, len(pages)


class Handler(http.server.SimpleHTTPRequestHandler):
    log = None

    def log_message(self, fmt, *args):  # record, do not print
        pass

    def send_response(self, code, message=None):
        Handler.log.append((code, self.path))
        super().send_response(code, message)


def serve(directory):
    Handler.log = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=directory))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def chromium(browser, url, screenshot=None, timeout=60):
    """(stdout = the DOM, stderr = the browser's log) of one headless Chromium visit."""
    with tempfile.TemporaryDirectory() as profile:
        args = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--enable-logging=stderr", "--v=0",
                f"--user-data-dir={profile}", "--window-size=1280,1400", "--virtual-time-budget=5000"]
        if screenshot:
            args.append(f"--screenshot={screenshot}")
        else:
            args.append("--dump-dom")
        proc = subprocess.run(args + [url], capture_output=True, text=True, timeout=timeout)
    return proc.stdout, proc.stderr


def js_errors(log):
    return [line.strip() for line in log.splitlines() if JS_ERROR.search(line) and "CONSOLE" in line
            or "Uncaught" in line]


def self_test(browser):
    """A page that throws and loads a missing script must show both problems."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "index.html"), "w") as fh:
            fh.write("<html><body><p>x</p><script src='missing.js'></script>"
                     "<script>throw new Error('check_site self-test');</script></body></html>")
        server = serve(d)
        try:
            _, log = chromium(browser, f"http://127.0.0.1:{server.server_port}/index.html")
            missing = [p for code, p in Handler.log if code == 404]
        finally:
            server.shutdown()
    found = [line for line in js_errors(log) if "self-test" in line]
    return bool(found) and any("missing.js" in p for p in missing)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default=os.path.join(ROOT, "site"), help="the built site (default: site/)")
    ap.add_argument("--out", default=os.path.join(ROOT, "site-check"), help="screenshots (default: site-check/)")
    ap.add_argument("--browser", default=None, help="Chromium executable (default: chromium on PATH)")
    args = ap.parse_args(argv)

    problems = []
    site = os.path.abspath(args.site)
    if not os.path.exists(os.path.join(site, "index.html")):
        print(f"check_site: no built site at {site}: run mkdocs build first", file=sys.stderr)
        return 1
    browser = args.browser or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("check_site: chromium not found (apt-get install chromium)", file=sys.stderr)
        return 1
    if not self_test(browser):
        print("check_site: the self-test page's JavaScript error was not detected; this browser's logging "
              "cannot be trusted", file=sys.stderr)
        return 1

    broken, count = crawl(site)
    problems += [f"broken link: {b}" for b in broken]
    print(f"crawled {count} pages: {len(broken)} broken internal links")

    os.makedirs(args.out, exist_ok=True)
    server = serve(site)
    base = f"http://127.0.0.1:{server.server_port}/"
    try:
        for path, expect, name in PAGES:
            url = base + path
            if not os.path.exists(os.path.join(site, path)):
                problems.append(f"missing page: {path}")
                continue
            start = len(Handler.log)
            shot = os.path.join(args.out, f"{name}.png")
            _, log = chromium(browser, url, screenshot=shot)
            dom, log2 = chromium(browser, url)
            errors = js_errors(log + "\n" + log2)
            failed = [p for code, p in Handler.log[start:] if code >= 400]
            problems += [f"{path}: JavaScript error: {e}" for e in errors]
            problems += [f"{path}: the browser requested {p}, which the site does not have" for p in failed]
            if expect not in dom:
                problems.append(f"{path}: rendered page lacks {expect!r}")
            if not os.path.exists(shot) or os.path.getsize(shot) < 10_000:
                problems.append(f"{path}: no screenshot ({shot})")
            print(f"{path}: {len(errors)} JavaScript errors, {len(failed)} failed requests, screenshot {shot}")
    finally:
        server.shutdown()
    for p in problems:
        print(f"check_site: {p}", file=sys.stderr)
    print("check_site: " + ("OK" if not problems else f"{len(problems)} problems"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
