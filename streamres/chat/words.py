"""Every string the chat shows, in English and Chinese (``--lang``; default from the locale)."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["LANGS", "default_lang", "health_reason", "status_line", "words"]

LANGS = ("en", "zh")

REASONS = {
    "en": {
        "capacity": "Model busy (at capacity)",
        "rate_limit": "Rate limited",
        "transient": "Server error",
        "connection": "Connection dropped",
        "stall": "No output for a while",
        "truncated": "The answer was cut short",
        "malformed": "Garbled data from the server",
        "prefill_rejected": "Model refused the partial answer",
        "ended_at_seam": "The model did not continue the answer",
        "circuit_open": "All models are busy",
        "deadline": "Out of time",
        "rejected": "The request was refused",
        "context_length": "Too long for the model's context window",
        "client_busy": "This computer was too busy to hear the server in time",
        "quota": "The account is out of credit",
        "slow": "The stream slowed to a trickle",
        "hedge": "Slow to start",
    },
    "zh": {
        "capacity": "模型繁忙（容量已满）",
        "rate_limit": "请求过于频繁",
        "transient": "服务器错误",
        "connection": "连接中断",
        "stall": "长时间没有输出",
        "truncated": "回答被截断",
        "malformed": "服务器返回了无法解析的数据",
        "prefill_rejected": "模型不接受部分回答",
        "ended_at_seam": "模型没有接着写下去",
        "circuit_open": "所有模型都很忙",
        "deadline": "超出时限",
        "rejected": "请求被拒绝",
        "context_length": "对话超出了模型的上下文长度",
        "client_busy": "本机太忙，没能及时收到服务器的回应",
        "quota": "账户余额不足",
        "slow": "输出慢得几乎停顿",
        "hedge": "启动缓慢",
    },
}

TEXT: dict[str, dict[str, str]] = {
    "en": {
        "prompt": "you> ",
        "retry": "{reason} — retrying in {delay:.0f} s (attempt {attempt})",
        "resume": "{reason} after {tokens} tokens — resuming…",
        "fallback": "Many people are using {a} right now — switching you to {b}",
        "fallback_because": "{a}: {reason} — switching you to {b}",
        "hedge": "{a} is slow to start — also asking {b}",
        "interrupted": "[stopped — the partial answer is kept]",
        "interrupted_empty": "[stopped — nothing had arrived yet]",
        "failed": "[failed: {error}]",
        "summary": "↻ recovered in {seconds:.1f} s: {attempts} attempts, resumed {resumes}×, "
        "{dedup} repeated tokens removed, answered by {model}",
        "welcome": "streamres chat — answers keep streaming through capacity errors. "
        "Type /help for commands, Ctrl-D to leave.",
        "target_embedded": "Talking to the embedded upstream ({models}) with faults: {faults}",
        "target_real": "Talking to {models}",
        "ctrl_c_prompt": "(Ctrl-D or /quit to leave)",
        "bye": "bye",
        "saved": "saved {n} messages to {path}",
        "nothing": "nothing to retry yet",
        "unknown": "unknown command {cmd}; /help lists them",
        "faults_now": "faults from the next answer: {faults}",
        "faults_real": "/faults only applies to the embedded upstream",
        "faults_none": "none",
        "faults_light": "light (one 529, then one reset)",
        "faults_storm": "storm (529 → error@40 → at capacity → fallback, then random faults)",
        "no_stats": "no answers yet",
        "mark_interrupted": "(stopped by the user; partial answer)",
        "ended_at_seam": "[incomplete: the model would not continue after the break; the "
        "answer stops where it was cut]",
        "mark_seam": "(incomplete: the model would not continue after the break)",
        "mark_failed": "(failed: {error}; partial answer)",
        "mark_failed_empty": "(failed: {error}; no answer)",
        # tables
        "h_model": "model",
        "h_health": "health",
        "h_requests": "requests",
        "h_success": "success",
        "h_capacity": "capacity",
        "h_stalls": "stalls",
        "h_resumes": "resumes",
        "h_ttft": "ttft p50",
        "h_latency": "latency p95",
        "h_breaker": "breaker",
        "h_provider": "provider",
        "h_url": "base URL",
        "h_weight": "weight",
        "h_answer": "#",
        "h_attempts": "attempts",
        "h_repeated": "repeated tokens removed",
        "h_lost": "time lost",
        "h_seconds": "seconds",
        "h_outcome": "outcome",
        "h_command": "command",
        "h_does": "does",
        "healthy": "healthy",
        "degraded": "degraded",
        "degrading": "degrading",
        "jammed": "jammed",
        "closed": "closed",
        "open": "open",
        "half_open": "half-open",
        "ok": "ok",
        "stopped": "stopped",
        "failed_short": "failed",
    },
    "zh": {
        "prompt": "你> ",
        "retry": "{reason} — {delay:.0f} 秒后重试（第 {attempt} 次）",
        "resume": "{reason}（已收到 {tokens} 个 token）— 正在续传…",
        "fallback": "{a} 当前使用人数较多 — 正在为你切换到 {b}",
        "fallback_because": "{a}：{reason} — 正在为你切换到 {b}",
        "hedge": "{a} 启动缓慢 — 同时询问 {b}",
        "interrupted": "[已停止 — 保留已收到的部分回答]",
        "interrupted_empty": "[已停止 — 尚未收到任何内容]",
        "failed": "[失败：{error}]",
        "summary": "↻ 已恢复，用时 {seconds:.1f} 秒：{attempts} 次请求，{resumes} 次续传，"
        "去除 {dedup} 个重复 token，由 {model} 完成",
        "welcome": "streamres chat — 即使模型满载，回答也不会中断。"
        "输入 /help 查看命令，Ctrl-D 退出。",
        "target_embedded": "正在连接内置上游（{models}），故障计划：{faults}",
        "target_real": "正在连接 {models}",
        "ctrl_c_prompt": "（按 Ctrl-D 或输入 /quit 退出）",
        "bye": "再见",
        "saved": "已将 {n} 条消息保存到 {path}",
        "nothing": "还没有可以重试的回答",
        "unknown": "未知命令 {cmd}；/help 列出所有命令",
        "faults_now": "从下一个回答起的故障：{faults}",
        "faults_real": "/faults 只适用于内置上游",
        "faults_none": "无",
        "faults_light": "轻度（一次 529，然后一次连接重置）",
        "faults_storm": "风暴（529 → 第 40 个 token 出错 → 容量已满 → 切换模型，之后随机故障）",
        "no_stats": "还没有回答",
        "mark_interrupted": "（被用户停止；部分回答）",
        "ended_at_seam": "[不完整：中断后模型没有接着写下去，回答停在中断处]",
        "mark_seam": "（不完整：中断后模型没有接着写下去）",
        "mark_failed": "（失败：{error}；部分回答）",
        "mark_failed_empty": "（失败：{error}；没有回答）",
        "h_model": "模型",
        "h_health": "状态",
        "h_requests": "请求数",
        "h_success": "成功率",
        "h_capacity": "容量错误",
        "h_stalls": "停顿",
        "h_resumes": "续传",
        "h_ttft": "首字延迟 p50",
        "h_latency": "延迟 p95",
        "h_breaker": "熔断器",
        "h_provider": "接口",
        "h_url": "地址",
        "h_weight": "权重",
        "h_answer": "#",
        "h_attempts": "请求次数",
        "h_repeated": "去除的重复 token",
        "h_lost": "损失时间",
        "h_seconds": "用时",
        "h_outcome": "结果",
        "h_command": "命令",
        "h_does": "作用",
        "healthy": "健康",
        "degraded": "降级",
        "degrading": "趋于拥堵",
        "jammed": "拥堵",
        "closed": "闭合",
        "open": "断开",
        "half_open": "半开",
        "ok": "完成",
        "stopped": "已停止",
        "failed_short": "失败",
    },
}

HELP = {
    "en": [
        ("/models", "the models and their state"),
        ("/health", "per-model success rate, capacity errors, latency, breaker, and why"),
        ("/stats", "recovery per answer: attempts, resumes, repeats removed, time lost"),
        (
            "/faults [PLAN]",
            "embedded upstream faults from the next answer: none, light, storm, "
            "or a plan such as reset@40,529",
        ),
        ("/retry", "regenerate the last answer"),
        ("/save [FILE]", "save the transcript as Markdown (stopped and failed answers marked)"),
        ("/quit", "leave (or Ctrl-D)"),
        ("Esc Enter", "a new line in the question (pasted text keeps its lines)"),
        ("Ctrl-R", "search earlier questions; ↑ ↓ recall them"),
        ("Ctrl-C", "stop an answer, keeping what arrived"),
    ],
    "zh": [
        ("/models", "模型及其状态"),
        ("/health", "各模型成功率、容量错误、延迟、熔断器及原因"),
        ("/stats", "每个回答的恢复情况：请求次数、续传、去除的重复、损失时间"),
        (
            "/faults [计划]",
            "从下一个回答起的内置上游故障：none、light、storm，或如 reset@40,529 的计划",
        ),
        ("/retry", "重新生成上一个回答"),
        ("/save [文件]", "将对话保存为 Markdown（标注被停止和失败的回答）"),
        ("/quit", "退出（或 Ctrl-D）"),
        ("Esc Enter", "在问题中换行（粘贴的文字保留换行）"),
        ("Ctrl-R", "搜索以前的问题；↑ ↓ 调出"),
        ("Ctrl-C", "停止当前回答，保留已收到的内容"),
    ],
}

#: The health reasons the library gives, and their Chinese.
_HEALTH_ZH = [
    (re.compile(r"circuit open after consecutive failures"), "连续失败，熔断器已断开"),
    (
        re.compile(r"cooling down for (\d+) s as the server asked \(Retry-After\)"),
        r"按服务器要求冷却 \1 秒（Retry-After）",
    ),
    (re.compile(r"too few requests to judge \((\d+) of (\d+)\)"), r"请求太少，尚无法判断（\1/\2）"),
    (re.compile(r"too few requests to judge"), "请求太少，尚无法判断"),
    (re.compile(r"success (\d+%) over the last (\d+) requests"), r"最近 \2 次请求成功率 \1"),
    (re.compile(r"capacity errors (\d+%) of recent requests"), r"最近请求中容量错误占 \1"),
    (re.compile(r"latency rising"), "延迟上升"),
]


def default_lang(environ: dict[str, str] | None = None) -> str:
    """``zh`` when the locale is Chinese (LC_ALL, LC_MESSAGES, LANG, LANGUAGE), else ``en``."""
    env = os.environ if environ is None else environ
    for name in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        value = env.get(name, "")
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def words(lang: str, key: str, **kw: Any) -> str:
    return TEXT[lang][key].format(**kw)


def reason(lang: str, kind: str | None) -> str:
    return REASONS[lang].get(kind or "", kind or "")


def health_reason(lang: str, text: str) -> str:
    if lang == "en":
        return text
    for pattern, zh in _HEALTH_ZH:
        if pattern.fullmatch(text):
            return pattern.sub(zh, text)
    return text


def status_line(ev: Any, lang: str) -> str:
    """A status event in the user's language (English is the library's own message)."""
    if lang == "en":
        return str(ev.message)
    why = reason(lang, ev.reason)
    if ev.type == "retry":
        return words(lang, "retry", reason=why, delay=ev.delay, attempt=ev.attempt)
    if ev.type == "resume":
        return words(lang, "resume", reason=why, tokens=ev.tokens_so_far)
    if ev.reason in ("capacity", "rate_limit", "circuit_open"):
        return words(lang, "fallback", a=ev.from_model, b=ev.to_model)
    if ev.reason == "hedge":  # the first model is still asked: nothing is switched yet
        return words(lang, "hedge", a=ev.from_model, b=ev.to_model)
    return words(lang, "fallback_because", a=ev.from_model, b=ev.to_model, reason=why)
