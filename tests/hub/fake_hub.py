#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the pull tests.

Serves each REPO=DIR given as the Hub does: GET /api/models/REPO/revision/REV (commit sha and siblings with
size, blobId and lfs.sha256), GET /REPO/resolve/REV/PATH (a redirect to /cdn/..., with X-Repo-Commit and
ETag headers), and /cdn/... with Range requests. Every request is logged as
"METHOD PATH range=RANGE auth=yes|no". Knobs: --cut FILE:BYTES (the first download of FILE stops after
BYTES), --bad-sha FILE (the listing gives a wrong sha256 and git sha1), --huge (the listing gives 1 PB sizes),
--private REPO / --gated REPO (401 / 403 unless "Authorization: Bearer --token" is sent).
"""
import argparse
import hashlib
import http.server
import os
import threading
import urllib.parse

LFS_EXT = (".safetensors", ".gguf", ".bin")


def scan(root):
    files = []
    for d, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = os.path.join(d, n)
            files.append((os.path.relpath(p, root), p))
    return sorted(files)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repos", nargs="+", help="ORG/NAME=DIR")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--cut", action="append", default=[])
    ap.add_argument("--bad-sha", action="append", default=[])
    ap.add_argument("--huge", action="store_true")
    ap.add_argument("--private", action="append", default=[])
    ap.add_argument("--gated", action="append", default=[])
    ap.add_argument("--token", default="secret")
    a = ap.parse_args()

    repos = {}
    for spec in a.repos:
        name, d = spec.split("=", 1)
        commit = hashlib.sha1(name.encode()).hexdigest()
        entries = {}
        for rel, path in scan(d):
            data = open(path, "rb").read()
            e = {"rfilename": rel, "size": len(data),
                 "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
            if rel in a.bad_sha:
                e["blobId"] = hashlib.sha1(b"something else").hexdigest()
            if rel.endswith(LFS_EXT):
                sha = hashlib.sha256(data).hexdigest()
                if rel in a.bad_sha:
                    sha = hashlib.sha256(b"something else").hexdigest()
                e["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
            if a.huge:
                e["size"] = 10**15
                if "lfs" in e:
                    e["lfs"]["size"] = 10**15
            entries[rel] = (e, path)
        repos[name] = (commit, entries)
    cuts = {c.rsplit(":", 1)[0]: int(c.rsplit(":", 1)[1]) for c in a.cut}
    lock = threading.Lock()
    log = open(a.log, "a", buffering=1)

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def refuse(self, repo):
            auth = self.headers.get("Authorization") == "Bearer " + a.token
            if repo in a.private and not auth:
                self.send(401, b'{"error":"Invalid credentials"}', [("X-Error-Code", "RepoNotFound")])
                return True
            if repo in a.gated and not auth:
                self.send(403, b'{"error":"gated"}', [("X-Error-Code", "GatedRepo")])
                return True
            return False

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            with lock:
                log.write("GET %s range=%s auth=%s\n" % (path, self.headers.get("Range", "-"),
                                                        "yes" if self.headers.get("Authorization") else "no"))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                return self.api(parts[2] + "/" + parts[3], "/".join(parts[5:]))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
            if parts[0] == "cdn" and len(parts) >= 4:
                return self.cdn(parts[1] + "/" + parts[2], "/".join(parts[3:]))
            self.send(404, b"no route")

        def api(self, repo, rev):
            if repo not in repos:
                return self.send(404, b'{"error":"Repository not found"}', [("X-Error-Code", "RepoNotFound")])
            if self.refuse(repo):
                return
            commit, entries = repos[repo]
            if rev not in ("main", commit):
                return self.send(404, b'{"error":"Invalid rev id"}', [("X-Error-Code", "RevisionNotFound")])
            import json
            body = json.dumps({"id": repo, "sha": commit, "siblings": [e for e, _ in entries.values()]}).encode()
            self.send(200, body, [("Content-Type", "application/json")])

        def resolve(self, repo, rev, name):
            if repo not in repos:
                return self.send(404, b"", [("X-Error-Code", "RepoNotFound")])
            if self.refuse(repo):
                return
            commit, entries = repos[repo]
            if rev not in ("main", commit) or name not in entries:
                return self.send(404, b"", [("X-Error-Code", "EntryNotFound")])
            e, _ = entries[name]
            etag = e["lfs"]["sha256"] if "lfs" in e else e["blobId"]
            loc = "http://%s:%d/cdn/%s/%s" % (self.server.server_address[0], self.server.server_address[1], repo,
                                              urllib.parse.quote(name))
            self.send(302, b"", [("Location", loc), ("X-Repo-Commit", commit), ("X-Linked-Etag", '"%s"' % etag),
                                 ("X-Linked-Size", str(e["size"]))])

        def cdn(self, repo, name):
            if repo not in repos or name not in repos[repo][1]:
                return self.send(404, b"")
            data = open(repos[repo][1][name][1], "rb").read()
            start, code = 0, 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start, code = int(rng[6:-1]), 206
                if start >= len(data):
                    return self.send(416, b"")
            body = data[start:]
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            if code == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
            self.end_headers()
            with lock:
                cut = cuts.pop(name, None)
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(a.port_file + ".tmp", a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
