"""Message content written once: text, images and documents in any provider's shape. Pure.

A message's ``content`` may be a string or a list of parts. Parts are read in any of the three
APIs' shapes and written in the one the route's provider takes, so an image a client sent to
the proxy in Anthropic's shape reaches an OpenAI model (or the fallback after it)::

    OpenAI Chat                          Anthropic Messages             Responses API
    {"type": "text", "text"}             {"type": "text", "text"}       input_text / output_text
    {"type": "image_url",                {"type": "image", "source":    {"type": "input_image",
      "image_url": {"url", "detail"}}      {"type": "url", "url"} or      "image_url", "detail"}
                                           {"type": "base64",
                                            "media_type", "data"}}
    {"type": "file", "file":             {"type": "document",           {"type": "input_file",
      {"file_data", "filename"}}           "source": {"type": "base64",   "file_data", "filename"}
                                            "media_type", "data"}}

Images by URL or as ``data:`` URLs, and documents as ``data:`` URLs, convert every way. What has
no counterpart (a file by id, a document by URL for Chat) passes unchanged: the upstream says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["content_for"]


def _data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def _split_data_url(url: str) -> tuple[str, str] | None:
    """``data:<type>;base64,<data>`` -> (type, data); else ``None``."""
    if not url.startswith("data:"):
        return None
    meta, sep, data = url[5:].partition(",")
    if not sep or not meta.endswith(";base64"):
        return None
    return meta[: -len(";base64")] or "application/octet-stream", data


def _canonical(part: Any) -> Any:
    """A part in any shape -> the Chat Completions shape (unknown parts unchanged)."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "image_url" and isinstance(part.get("image_url"), str):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    source = part.get("source")
    if kind == "image" and isinstance(source, Mapping):
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
        if source.get("type") == "base64":
            url = _data_url(str(source.get("media_type", "image/png")), str(source.get("data")))
            return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document" and isinstance(source, Mapping) and source.get("type") == "base64":
        url = _data_url(str(source.get("media_type", "application/pdf")), str(source.get("data")))
        name = part.get("title") or "document.pdf"
        return {"type": "file", "file": {"file_data": url, "filename": name}}
    if kind == "input_file" and isinstance(part.get("file_data"), str):
        file = {"file_data": part["file_data"], "filename": part.get("filename") or "file"}
        return {"type": "file", "file": file}
    return dict(part)


def _anthropic(part: Any) -> Any:
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
        url = str(part["image_url"].get("url", ""))
        data = _split_data_url(url)
        if data is None:
            return {"type": "image", "source": {"type": "url", "url": url}}
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": data[0], "data": data[1]},
        }
    if kind == "file" and isinstance(part.get("file"), Mapping):
        file = part["file"]
        data = _split_data_url(str(file.get("file_data", "")))
        if data is not None:
            block: dict[str, Any] = {
                "type": "document",
                "source": {"type": "base64", "media_type": data[0], "data": data[1]},
            }
            if file.get("filename"):
                block["title"] = file["filename"]
            return block
    return part


def _responses(part: Any, role: str) -> Any:
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "text":
        return {
            "type": "output_text" if role == "assistant" else "input_text",
            "text": part["text"],
        }
    if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
        image = part["image_url"]
        return {
            "type": "input_image",
            "image_url": image.get("url"),
            "detail": image.get("detail") or "auto",
        }
    if kind == "file" and isinstance(part.get("file"), Mapping):
        file = part["file"]
        if "file_data" in file:
            return {
                "type": "input_file",
                "file_data": file["file_data"],
                "filename": file.get("filename") or "file",
            }
    return part


def content_for(provider: str, content: Any, role: str = "user") -> Any:
    """A message's ``content`` in ``provider``'s shape (a string stays a string).

    >>> content_for("anthropic", [{"type": "input_image", "image_url": "https://x/a.png"}])
    [{'type': 'image', 'source': {'type': 'url', 'url': 'https://x/a.png'}}]
    """
    if not isinstance(content, list):
        return content
    parts = [_canonical(p) for p in content]
    if provider == "anthropic":
        return [_anthropic(p) for p in parts]
    if provider == "openai-responses":
        return [_responses(p, role) for p in parts]
    return parts
