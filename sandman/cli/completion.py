"""Shell completion: `sandman completion bash|zsh`, and the engine both scripts call.

One engine in Python answers every shell: `sandman __complete WORD... CURRENT`
prints the candidates for the last word, one per line, then a directive line
``:N`` (cobra's protocol, which kubectl speaks: 4 = no file completion). The
shell scripts are thin wrappers around it, and `kubectl_complete-sandman`
(installed next to `kubectl-sandman`) is the same engine, so `kubectl
sandman <TAB>` completes too (kubectl 1.26+ runs that executable).

What it completes: commands, subcommands and flags from the argparse
parsers themselves (nothing listed twice), choices (`-o`, `--transport`,
`--stream`), kubeconfig contexts, and from the cluster (a short timeout,
silent on failure) namespaces, sandbox pods and pools, honouring
`--kubeconfig`, `--context` and `-n` already on the line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from sandman.cli.main import COMMANDS, build_parser

# cobra's ShellCompDirective values (the format kubectl plugins answer in).
DEFAULT = 0  # no candidate: let the shell complete file names
NO_FILES = 4
# A completion must not hang the shell: cluster look-ups give up after this
# (5 s: a TLS handshake plus one list on a busy apiserver; the environment
# variable raises it for slow links).
LOOKUP_TIMEOUT_S = 5.0
LOOKUP_TIMEOUT_ENV = "SANDMAN_COMPLETION_TIMEOUT"
# Positionals completed with names from the cluster, by argparse dest (and
# the pool verbs whose NAME is an existing pool).
POD_ARGS = frozenset({"pod", "src", "dst"})
POOL_VERBS = frozenset({"scale", "delete"})

BASH = r"""# bash completion for sandman and kubectl-sandman
#   source <(sandman completion bash)      # or save it under /etc/bash_completion.d/
_sandman_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" out directive
    out=$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return 0
    directive=${out##*:}
    out=${out%:*}
    local IFS=$'\n'
    COMPREPLY=($(compgen -W "$out" -- "$cur"))
    if [[ ${#COMPREPLY[@]} -eq 0 && $(( directive & 4 )) -eq 0 ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return 0
}
complete -o default -F _sandman_complete sandman kubectl-sandman
"""

ZSH = r"""#compdef sandman kubectl-sandman
# zsh completion for sandman and kubectl-sandman
#   autoload -U compinit && compinit; source <(sandman completion zsh)
_sandman() {
    local -a lines cands
    local directive
    lines=("${(@f)$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    directive=${${lines[-1]}#:}
    cands=("${(@)lines[1,-2]}")
    cands=(${cands:#})
    if (( ${#cands} )); then
        compadd -- "${cands[@]}"
    elif (( (directive & 4) == 0 )); then
        _files
    fi
}
compdef _sandman sandman kubectl-sandman
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion",
        help="print the shell completion script (bash or zsh)",
        description="bash: `source <(sandman completion bash)`; zsh: `autoload -U compinit "
        "&& compinit; source <(sandman completion zsh)`. Both complete `kubectl-sandman` "
        "too; `kubectl sandman <TAB>` uses kubectl_complete-sandman.",
    )
    p.add_argument("shell", choices=sorted(SCRIPTS))
    p.set_defaults(func=print_script)


def print_script(args: argparse.Namespace) -> int:
    sys.stdout.write(SCRIPTS[args.shell])
    return 0


# -- the engine ---------------------------------------------------------------------------
def _subparsers(p: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a
    return None


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def _takes_value(a: argparse.Action) -> bool:
    return a.nargs != 0 and not isinstance(
        a, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction)
    )


def _positionals(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in p._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


def complete(words: Sequence[str]) -> tuple[list[str], int]:
    """Candidates for ``words[-1]`` given the words before it (the command line
    after the program name) and the directive for the shell."""
    words = list(words) or [""]
    cur, before = words[-1], words[:-1]
    if "--" in before:
        return [], DEFAULT  # the sandbox command's own words: files
    if not before:
        return sorted(c for c in COMMANDS if c.startswith(cur)), NO_FILES
    try:
        root = build_parser(before[0])
    except SystemExit:  # a command whose extra is not installed
        return [], DEFAULT
    sub = _subparsers(root)
    parser = sub.choices.get(before[0]) if sub else None
    if parser is None:
        return [], DEFAULT
    rest = before[1:]
    path = [before[0]]
    seen: dict[str, str] = {}
    while True:
        nested = _subparsers(parser)
        verbs_done = nested is None
        opts = _options(parser)
        positional_count, i = 0, 0
        verb_at = None
        while i < len(rest):
            w = rest[i]
            if w in opts:
                if _takes_value(opts[w]) and i + 1 < len(rest):
                    seen[opts[w].dest] = rest[i + 1]
                    i += 1
            elif w.startswith("-") and "=" in w and w.split("=", 1)[0] in opts:
                seen[opts[w.split("=", 1)[0]].dest] = w.split("=", 1)[1]
            elif not w.startswith("-"):
                if nested is not None:
                    verb_at = i
                    break
                positional_count += 1
            i += 1
        if verb_at is not None and nested is not None and rest[verb_at] in nested.choices:
            path.append(rest[verb_at])
            parser, rest = nested.choices[rest[verb_at]], rest[verb_at + 1 :]
            continue
        break
    prev = rest[-1] if rest else None
    if prev in opts and _takes_value(opts[prev]):
        return _values(opts[prev], opts[prev].dest, cur, seen)
    if cur.startswith("-"):
        return sorted(s for s in opts if s.startswith(cur)), NO_FILES
    if not verbs_done and nested is not None:
        return sorted(v for v in nested.choices if v.startswith(cur)), NO_FILES
    positionals = _positionals(parser)
    if positional_count >= len(positionals):
        if not positionals or positionals[-1].nargs not in ("+", "*"):
            return [], DEFAULT
        positional_count = len(positionals) - 1
    action = positionals[positional_count]
    kind = action.dest
    if kind == "name" and path[0] == "pool" and path[-1] in POOL_VERBS:
        kind = "pool"
    return _values(action, kind, cur, seen)


def _values(
    action: argparse.Action, kind: str, cur: str, seen: dict[str, str]
) -> tuple[list[str], int]:
    if action.choices:
        return sorted(str(c) for c in action.choices if str(c).startswith(cur)), NO_FILES
    if kind == "context":
        return _contexts(seen, cur), NO_FILES
    if kind == "namespace" or kind == "pool" or kind in POD_ARGS:
        copy = kind in ("src", "dst")
        if copy and (cur.startswith(("/", ".", "~")) or ":" in cur):
            return [], DEFAULT  # a local path, or a path inside the pod
        try:
            names = asyncio.run(asyncio.wait_for(_lookup(kind, seen), _lookup_timeout()))
        except Exception:  # a completion never fails loudly
            names = []
        found = sorted(n for n in names if n.startswith(cur))
        return found, (DEFAULT if copy else NO_FILES)
    return [], DEFAULT  # kubeconfig files, images, commands: the shell's own


def _contexts(seen: dict[str, str], cur: str) -> list[str]:
    try:
        import os

        from kubernetes.config import kube_config

        from sandman.kube_async import kubeconfig_paths

        paths = kubeconfig_paths(seen.get("kubeconfig"), os.environ)
        if paths is None:
            return []
        contexts = kube_config.KubeConfigMerger(paths).config.value.get("contexts") or []
        names = [getattr(c, "value", c).get("name", "") for c in contexts]
    except Exception:
        return []
    return sorted(n for n in names if n.startswith(cur))


def _lookup_timeout() -> float:
    import os

    try:
        return max(0.1, float(os.environ.get(LOOKUP_TIMEOUT_ENV) or LOOKUP_TIMEOUT_S))
    except ValueError:
        return LOOKUP_TIMEOUT_S


async def _lookup(dest: str, seen: dict[str, str]) -> list[str]:
    from sandman.contract import LABEL_POOL, LABEL_SANDBOX
    from sandman.kube_async import NAMESPACES, PODS, REPLICASETS, KubeClient

    kube = KubeClient.from_kubeconfig(
        seen.get("kubeconfig"), context=seen.get("context"), user_agent="sandman-completion"
    )
    ns = seen.get("namespace") or kube.creds.namespace
    async with kube:
        if dest == "namespace":
            doc = await kube.list(NAMESPACES, limit=500)
            return [i["metadata"]["name"] for i in doc.get("items", [])]
        if dest == "pool":
            doc = await kube.list(REPLICASETS, ns, label_selector=LABEL_POOL, limit=500)
            return [i["metadata"]["labels"][LABEL_POOL] for i in doc.get("items", [])]
        doc = await kube.list(PODS, ns, label_selector=f"{LABEL_SANDBOX}=true", limit=500)
        names = [i["metadata"]["name"] for i in doc.get("items", [])]
        return [f"{n}:" for n in names] if dest in ("src", "dst") else names


def complete_main(words: Sequence[str]) -> int:
    """``sandman __complete WORD...``: candidates, then ``:DIRECTIVE``."""
    cands, directive = complete(words)
    sys.stdout.write("".join(f"{c}\n" for c in cands) + f":{directive}\n")
    return 0


def kubectl_complete() -> int:
    """Entry point of ``kubectl_complete-sandman`` (kubectl passes the words after `sandman`)."""
    return complete_main(sys.argv[1:])
