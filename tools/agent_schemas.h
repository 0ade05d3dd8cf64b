// Tool-argument schemas of real coding agents (Codex CLI, Claude Code, MCP servers, pydantic
// models), as they send them, for `moestream bench constraint` and the schema tests
// (tests/server/json_schema_corpus_test.cpp): what schema-following decoding must handle.
#pragma once

#include <array>
#include <string_view>

namespace moestream::tools {

struct agent_schema {
    std::string_view name;  // the tool's name (a valid tool name)
    std::string_view what;  // where it comes from / what it exercises
    std::string_view schema;
};

inline constexpr std::array<agent_schema, 12> k_agent_schemas = {{
    {"shell", "Codex CLI shell: a command as an array of strings, optional workdir and timeout",
     R"json({"type":"object","properties":{"command":{"type":"array","items":{"type":"string"},"description":"The command to execute"},"workdir":{"type":"string","description":"The working directory to execute the command in"},"timeout_ms":{"type":"number","description":"The timeout for the command in milliseconds"},"with_escalated_permissions":{"type":"boolean"},"justification":{"type":"string"}},"required":["command"],"additionalProperties":false})json"},
    {"apply_patch", "Codex CLI apply_patch (function form): one string argument",
     R"json({"type":"object","properties":{"input":{"type":"string","description":"The entire contents of the apply_patch command"}},"required":["input"],"additionalProperties":false})json"},
    {"read_file", "read_file with optional integer offsets (bounded)",
     R"json({"type":"object","properties":{"path":{"type":"string","minLength":1},"offset":{"type":"integer","minimum":1,"description":"1-based line to start at"},"limit":{"type":"integer","minimum":1,"maximum":2000}},"required":["path"],"additionalProperties":false})json"},
    {"Bash", "Claude Code Bash (zod output: $schema, number with maximum)",
     R"json({"type":"object","properties":{"command":{"type":"string","description":"The command to execute"},"timeout":{"type":"number","description":"Optional timeout in milliseconds (max 600000)","maximum":600000},"description":{"type":"string"},"run_in_background":{"type":"boolean"}},"required":["command"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"})json"},
    {"Edit", "an edit tool with nested objects and enums",
     R"json({"type":"object","properties":{"file_path":{"type":"string"},"edits":{"type":"array","minItems":1,"maxItems":8,"items":{"type":"object","properties":{"old_string":{"type":"string"},"new_string":{"type":"string"},"mode":{"type":"string","enum":["replace","insert_before","insert_after"]},"replace_all":{"type":"boolean","default":false}},"required":["old_string","new_string","mode"],"additionalProperties":false}},"options":{"type":"object","properties":{"encoding":{"enum":["utf-8","latin-1"]},"create_if_missing":{"type":"boolean"}},"additionalProperties":false}},"required":["file_path","edits"],"additionalProperties":false})json"},
    {"TodoWrite", "Claude Code TodoWrite: an array of objects with enums and minLength",
     R"json({"type":"object","properties":{"todos":{"type":"array","items":{"type":"object","properties":{"content":{"type":"string","minLength":1},"status":{"type":"string","enum":["pending","in_progress","completed"]},"activeForm":{"type":"string","minLength":1}},"required":["content","status","activeForm"],"additionalProperties":false},"description":"The updated todo list"}},"required":["todos"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"})json"},
    {"search", "pydantic Optional fields: anyOf with null, defaults, titles",
     R"json({"properties":{"query":{"title":"Query","type":"string"},"max_results":{"anyOf":[{"type":"integer","minimum":1,"maximum":50},{"type":"null"}],"default":null,"title":"Max Results"},"site":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},"required":["query"],"title":"SearchArgs","type":"object"})json"},
    {"run", "a command as a string or an array of strings (anyOf by type), nullable cwd",
     R"json({"type":"object","properties":{"cmd":{"anyOf":[{"type":"string"},{"type":"array","items":{"type":"string"},"minItems":1}]},"cwd":{"type":["string","null"]},"env":{"type":"object","additionalProperties":{"type":"string"}}},"required":["cmd"],"additionalProperties":false})json"},
    {"browser", "an MCP browser tool: oneOf of objects told apart by a const",
     R"json({"type":"object","properties":{"action":{"oneOf":[{"type":"object","properties":{"type":{"const":"click"},"x":{"type":"integer","minimum":0},"y":{"type":"integer","minimum":0}},"required":["type","x","y"],"additionalProperties":false},{"type":"object","properties":{"type":{"const":"type"},"text":{"type":"string"}},"required":["type","text"],"additionalProperties":false},{"type":"object","properties":{"type":{"const":"scroll"},"dy":{"type":"number","minimum":-10,"maximum":10}},"required":["type","dy"],"additionalProperties":false}]}},"required":["action"],"additionalProperties":false})json"},
    {"grep", "$defs and $ref (pydantic nested models), bounded arrays",
     R"json({"$defs":{"Range":{"type":"object","properties":{"start":{"type":"integer","minimum":0},"end":{"type":"integer","minimum":0}},"required":["start","end"],"additionalProperties":false}},"type":"object","properties":{"pattern":{"type":"string"},"paths":{"type":"array","items":{"type":"string"},"maxItems":3},"ranges":{"type":"array","items":{"$ref":"#/$defs/Range"},"maxItems":4}},"required":["pattern"],"additionalProperties":false})json"},
    {"WebFetch", "Claude Code WebFetch: format is an annotation",
     R"json({"type":"object","properties":{"url":{"type":"string","format":"uri","description":"The URL to fetch content from"},"prompt":{"type":"string"}},"required":["url","prompt"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"})json"},
    {"free", "no schema at all: any object",
     R"json({"type":"object"})json"},
}};

}  // namespace moestream::tools
