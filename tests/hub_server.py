"""A Hugging Face Hub on 127.0.0.1 for the tests (this machine reaches no hub): the few endpoints
huggingface_hub calls to fetch a model, answered as the hub answers them.

    GET  /api/models/ORG/NAME/revision/REV    model info: the commit (sha) and the files (siblings)
    HEAD /ORG/NAME/resolve/REV/FILE           X-Repo-Commit, ETag, Content-Length (hf_hub_download's metadata)
    GET  /ORG/NAME/resolve/REV/FILE           the file's bytes

A repository unknown to it is 404 RepoNotFound (401 when it is listed as private, as the hub
answers an anonymous caller), a gated one's files are 401 GatedRepo, an unknown revision 404
RevisionNotFound, an unknown file 404 EntryNotFound (the X-Error-Code huggingface_hub sorts its
errors by). Every request is logged, so a test can say the network was never used."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repository:
    revisions: dict[str, dict[str, bytes]]  # branch or tag -> {file name: bytes}
    gated: bool = False

    def commit(self, revision: str) -> str | None:
        """The 40-hex commit a branch or tag stands for (or that commit itself)."""
        for name, files in self.revisions.items():
            digest = hashlib.sha1(name.encode() + b"".join(k.encode() + v for k, v in sorted(files.items())))
            if revision in (name, digest.hexdigest()):
                return digest.hexdigest()
        return None

    def files(self, revision: str) -> dict[str, bytes]:
        commit = self.commit(revision)
        return next(f for n in self.revisions if self.commit(n) == commit for f in [self.revisions[n]])


@dataclass
class FakeHub:
    repositories: dict[str, Repository] = field(default_factory=dict)
    private: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append(f"{request.command} {request.path}")
        parts = [unquote(p) for p in urlsplit(request.path).path.strip("/").split("/")]
        api = parts[:2] == ["api", "models"]
        if api:
            parts = parts[2:]
        repo_id = "/".join(parts[:2])
        repo = self.repositories.get(repo_id)
        if repo is None:
            return self.error(request, 401 if repo_id in self.private else 404, "RepoNotFound")
        if api and len(parts) == 4 and parts[2] == "revision":
            commit = repo.commit(parts[3])
            if commit is None:
                return self.error(request, 404, "RevisionNotFound")
            info = {"id": repo_id, "sha": commit, "gated": "auto" if repo.gated else False}
            info["siblings"] = [{"rfilename": name} for name in sorted(repo.files(commit))]
            return self.send(request, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if api or len(parts) < 5 or parts[2] != "resolve":
            return self.error(request, 404, "")
        commit = repo.commit(parts[3])
        if commit is None:
            return self.error(request, 404, "RevisionNotFound")
        if repo.gated:
            return self.error(request, 401, "GatedRepo", commit)
        data = repo.files(commit).get("/".join(parts[4:]))
        if data is None:
            return self.error(request, 404, "EntryNotFound", commit)
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        self.send(request, 200, data, {"X-Repo-Commit": commit, "ETag": etag}, body)

    def error(self, request: BaseHTTPRequestHandler, status: int, code: str, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code} if code else {}
        if commit:
            headers["X-Repo-Commit"] = commit
        self.send(request, status, json.dumps({"error": code or "not found"}).encode(), headers, True)

    @staticmethod
    def send(request: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict, body: bool) -> None:
        request.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            request.send_header(key, value)
        request.end_headers()
        if body and request.command != "HEAD":
            request.wfile.write(data)
