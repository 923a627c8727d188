"""The commands of `m27`, one module each; this table names them all.

Each command's line in ``m27 --help`` stands here, not in its module, so that the overview
(``m27 --help``, or ``m27`` with a mistyped command) lists every command without importing
any of them: all of them import in about half a second (python-telegram-bot, Prefect's
client, the checkpoint store), one of them in a tenth. Each module's ``register`` takes
its line from :data:`SUMMARY`.
"""

from __future__ import annotations

#: (command, its module under m27.cli.commands, its line in `m27 --help`), in the order
#: `m27 --help` lists them.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("run", "run", "run a pipeline file"),
    ("validate", "validate", "check a pipeline file and list every problem"),
    ("runs", "runs", "list runs (newest last)"),
    ("status", "status", "show a run's steps, or the live runs"),
    ("logs", "logs", "print a step's log"),
    ("cancel", "cancel", "cancel a run, or some of its steps"),
    ("wait", "wait", "wait until runs end; exit 0 if every one succeeded"),
    ("checkpoints", "checkpoints", "list, verify or garbage-collect a run's checkpoints"),
    ("gpus", "gpus", "show the GPUs of this node"),
    ("queue", "queue", "show the GPU queue: tiers, effective priorities, reasons"),
    ("bump", "bump", "change a step's priority"),
    ("agent", "agent", "the node service: the GPU queue and the node's Prefect server"),
    ("config", "config_cmd", "show the effective settings and where each came from"),
    ("exporter", "exporter", "serve GPU and pipeline metrics to Prometheus"),
    ("notify", "notify", "Telegram notifications: send a test, show or retry the outbox"),
    ("notifier", "notify", "follow the event log and send Telegram messages (a service)"),
    ("bot", "notify", "answer Telegram commands from allow-listed chats (a service)"),
    ("simulate", "simulate", "replay a trace under m27 and baseline policies"),
    ("deploy", "deploy", "create or update a Prefect deployment of a pipeline"),
    ("pool", "pool", "manage the m27 work pool on a Prefect server"),
    ("worker", "worker", "run this node's Prefect worker (type m27)"),
)

#: command -> its line in `m27 --help`
SUMMARY = {name: line for name, _, line in COMMANDS}
#: command -> the module that registers it
MODULE = {name: module for name, module, _ in COMMANDS}
