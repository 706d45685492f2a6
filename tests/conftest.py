"""What every test shares: the packaged model, its tokenizer and a tiny random Llama; the session's real server
(`served_model`: the packaged model on a real LocalBackend, which marks a test slow); the fake judge API (`fake`,
`judge`); the session's vLLM zygote; and the check that no process a test started outlives the session.
Builders that tests share (groups, runs, CLI runners) are in tests/helpers.py; tests/ mirrors agentrl/."""

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

# litellm fetches a model price list at import unless told to use its bundled copy; the suite has no network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_configure(config):
    from tests import xdist_groups

    config.pluginmanager.register(xdist_groups, "agentrl-xdist-groups")  # `-n 2 --dist loadgroup`


@pytest.fixture(scope="session")
def base_model_path() -> str:
    from agentrl.foundation.base_models import resolve_base_model

    return resolve_base_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(base_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_path)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, base_model_path):
    """A tiny random Llama (2 layers, width 64) with the packaged tokenizer: the trainer's code paths in a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(base_model_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
async def served_model(tmp_path_factory):
    """The packaged model registered with a real LocalBackend (vLLM on loopback + the trainer), for the session."""
    import agentrl

    model = agentrl.TrainableModel(name="test-agent", project="tests", base_path=str(tmp_path_factory.mktemp("runs")))
    backend = agentrl.LocalBackend()
    await model.register(backend)
    yield model
    await backend.close()


@pytest.fixture
def fake(monkeypatch):
    """A judge API behind a local server speaking OpenAI's protocol (tests/fake_openai.py), faults on command.
    Its faults come back at once, so retries skip the backoff a rate-limited real API needs."""
    from tenacity import wait_none

    from agentrl.judges import call
    from tests.fake_openai import FakeOpenAI

    monkeypatch.setattr(call, "RETRY_WAIT", wait_none())

    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _judges_start_unremembered():
    """A judge that once answered without logprobs is read from JSON for the rest of its process
    (`agentrl.judges.readout`); each test starts with none remembered, whatever ran before it."""
    yield
    readout = sys.modules.get("agentrl.judges.readout")  # loaded only by tests that judge
    if readout is not None:
        readout._FELL_BACK.clear()


@pytest.fixture
def judge(fake):
    """The fake judge as an `agentrl.Model`."""
    import agentrl

    return agentrl.Model(name="judge", base_url=fake.base_url, api_key="test")


SERVER_FIXTURES = {"served_model"}


def pytest_collection_modifyitems(config, items):
    """Every test on the shared server is slow: the fast tier (`-m "not slow"`) starts no server. Under
    `-n 2 --dist loadgroup` the slow tests share one worker (tests/xdist_groups.py)."""
    from tests.xdist_groups import LATER_GROUP

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(LATER_GROUP))


def pytest_collection_finish(session):
    """After `-m` has chosen the tests: a run with slow tests gets the session's vLLM zygote. An xdist worker
    collects every test but may run none of the slow ones, so it starts the zygote at its first slow test."""
    from tests.xdist_groups import is_worker

    if not is_worker(session.config) and any(item.get_closest_marker("slow") for item in session.items):
        _start_zygote()


_zygote: subprocess.Popen | None = None


def _start_zygote() -> None:
    """One vLLM zygote for the session (agentrl_vllm.zygote): the ~26 CPU servers the slow tests start, in this
    process and in the notebooks and CLI runs it starts, fork from it rather than import vLLM each time.
    It imports while the first tests run. AGENTRL_VLLM_ZYGOTE="" runs the suite without it."""
    global _zygote
    from agentrl.backend.serving.server import without_secrets
    from agentrl.backend.serving.zygote import ZYGOTE_ENV, start_zygote

    if ZYGOTE_ENV in os.environ:  # set by the caller (empty: no zygote), or by a parent session
        return
    folder = Path(tempfile.mkdtemp(prefix="agentrl-zygote-"))  # short: a socket's path has at most 107 bytes
    _zygote = start_zygote(folder / "zygote.sock", folder / "zygote.log", without_secrets(dict(os.environ)))
    os.environ[ZYGOTE_ENV] = str(folder / "zygote.sock")


@pytest.fixture(autouse=True)
def _fast_tests_start_no_server(request, monkeypatch):
    """A test outside the slow tier that starts a vLLM server fails, naming the fix, so the fast tier stays fast;
    a slow test gets the session's zygote."""
    if request.node.get_closest_marker("slow") is not None:
        _start_zygote()  # started already, unless this is an xdist worker's first slow test
        return

    async def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{request.node.nodeid} starts a vLLM server: mark it @pytest.mark.slow")

    from agentrl.backend.serving.server import VLLMServer

    monkeypatch.setattr(VLLMServer, "start", refuse)


# Every process the suite starts inherits this marker, so the end-of-session check finds them even
# after they were re-parented (an orphaned vLLM engine, a subprocess whose test failed).
SESSION_MARKER = "AGENTRL_TEST_SESSION"
os.environ.setdefault(SESSION_MARKER, f"{os.getpid()}-{uuid.uuid4().hex}")


def _left_behind() -> list[psutil.Process]:
    marker = os.environ[SESSION_MARKER]
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.pid in (os.getpid(), _zygote and _zygote.pid) or process.status() == psutil.STATUS_ZOMBIE:
                continue
            ours = process.environ().get(SESSION_MARKER) == marker
            # vLLM servers, agentrl commands and test scripts; not helpers that end at this process's
            # exit (wandb-core is stopped by wandb's atexit hook, after this check).
            if ours and any(word in " ".join(process.info["cmdline"] or []) for word in ("vllm", "agentrl", "tests")):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a vLLM or agentrl process that the tests started is still alive, and end it."""
    try:
        _check_nothing_left_behind(session)
    finally:
        if _zygote is not None:  # after the check: its servers would end with it, hiding a leak
            _zygote.terminate()
            _zygote.wait(timeout=30)
            shutil.rmtree(Path(_zygote.args[-1]).parent, ignore_errors=True)  # its socket's folder


def _check_nothing_left_behind(session) -> None:
    from tests.xdist_groups import is_worker

    if is_worker(session.config):  # `-n 2`: the controller checks, once every worker is done
        return
    leftovers = _left_behind()
    if not leftovers:
        return
    _, still_alive = psutil.wait_procs(leftovers, timeout=15)  # a process stopped just now may still be exiting
    if still_alive:
        described = "\n".join(f"  {p.pid}: {' '.join(p.info['cmdline'] or [])[:150]}" for p in still_alive)
        print(f"\nprocesses started by the tests were still running at the end (now killed):\n{described}")
        for process in still_alive:
            process.kill()
        session.exitstatus = 1
