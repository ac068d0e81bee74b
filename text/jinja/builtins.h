// The filters, tests, global functions and Python methods (str.strip, dict.items, ...) that
// templates may call, with jinja2's and Python's semantics.
#pragma once

#include <string>

#include "text/jinja/value.h"

namespace llm::jinja {

class Interpreter;

bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);
Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool ApplyTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
// range, namespace, dict, raise_exception, strftime_now.
Value GlobalFunction(const std::string& name);

// obj.name and obj[key] as jinja2's sandbox resolves them (methods first for attributes, items
// first for subscripts); a miss gives Undefined carrying jinja2's message.
Value GetAttribute(const Value& obj, const std::string& name);
Value GetItem(const Value& obj, const Value& key);
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python iteration: list items, dict keys, string characters; Undefined iterates as empty.
ValueList Iterate(const Value& v);
// Raises jinja2's UndefinedError for an Undefined used where a value is needed.
[[noreturn]] void FailUndefined(const Value& v);

}  // namespace llm::jinja
