#include "inference/structured/json_schema.h"

#include <array>
#include <map>
#include <optional>
#include <set>

namespace structured {
namespace {

using json = nlohmann::ordered_json;

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly"};
  return s;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> s = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "allOf",
                                          "$ref", "$defs", "definitions"};
  return s;
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}
  Grammar g;

  // Whitespace between tokens: "" | " " | "\n" [ \t]{0,20}.
  Seq ws() {
    if (!ws_) {
      ByteSet blank;
      blank.set(' ');
      blank.set('\t');
      ws_ = g.rule_of({{}, g.literal(" "), g.literal("\n") + g.repeat({g.bytes(blank)}, 0, 20)});
    }
    return {*ws_};
  }

  // One character of a JSON string: valid UTF-8 other than '"', '\\' and controls, or an escape.
  Symbol string_char() {
    if (!char_) {
      ByteSet ascii;
      for (int b = 0x20; b <= 0x7f; ++b) ascii.set(static_cast<size_t>(b));
      ascii.reset('"');
      ascii.reset('\\');
      const Symbol cont = g.range(0x80, 0xbf);
      ByteSet e1;
      for (int b : {0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xeb, 0xec, 0xee, 0xef}) e1.set(static_cast<size_t>(b));
      ByteSet esc;
      for (char c : std::string("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
      ByteSet hex;
      for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
      const Symbol h = g.bytes(hex);
      char_ = g.rule_of({{g.bytes(ascii)},
                         {g.range(0xc2, 0xdf), cont},
                         {g.byte(0xe0), g.range(0xa0, 0xbf), cont},
                         {g.bytes(e1), cont, cont},
                         {g.byte(0xed), g.range(0x80, 0x9f), cont},
                         {g.byte(0xf0), g.range(0x90, 0xbf), cont, cont},
                         {g.range(0xf1, 0xf3), cont, cont, cont},
                         {g.byte(0xf4), g.range(0x80, 0x8f), cont, cont},
                         {g.byte('\\'), g.bytes(esc)},
                         {g.byte('\\'), g.byte('u'), h, h, h, h}});
    }
    return *char_;
  }

  Seq string(int64_t lo, int64_t hi) {
    if (lo == 0 && hi < 0) {
      if (!string_) string_ = g.rule_of({g.literal("\"") + g.star({string_char()}) + g.literal("\"")});
      return {*string_};
    }
    return g.literal("\"") + g.repeat({string_char()}, lo, hi) + g.literal("\"");
  }

  Seq integer() {
    if (!integer_) {
      integer_ = g.rule_of({g.repeat(g.literal("-"), 0, 1) +
                            Seq{g.rule_of({g.literal("0"), Seq{g.range('1', '9')} + g.repeat({g.range('0', '9')}, 0, 15)})}});
    }
    return {*integer_};
  }

  Seq number() {
    if (!number_) {
      const Seq digit{g.range('0', '9')};
      ByteSet e, sign;
      e.set('e');
      e.set('E');
      sign.set('+');
      sign.set('-');
      const Seq fraction = g.literal(".") + g.repeat(digit, 1, 16);
      const Seq exponent = Seq{g.bytes(e)} + g.repeat({g.bytes(sign)}, 0, 1) + g.repeat(digit, 1, 3);
      number_ = g.rule_of({integer() + g.repeat(fraction, 0, 1) + g.repeat(exponent, 0, 1)});
    }
    return {*number_};
  }

  // "[" ws (item ws ("," ws item ws){lo-1, hi-1})? "]"
  Seq array(const Seq& item, int64_t lo, int64_t hi) {
    if (hi == 0) return g.literal("[") + ws() + g.literal("]");
    const Seq one = item + ws();
    const Seq rest = g.repeat(g.literal(",") + ws() + one, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    const Seq body = lo > 0 ? one + rest : Seq{g.rule_of({one + rest, {}})};
    return g.literal("[") + ws() + body + g.literal("]");
  }

  // "{" ws (member ("," ws member)*)? "}", member = string ws ":" ws value ws
  Seq object_of(const Seq& value) {
    const Seq member = string(0, -1) + ws() + g.literal(":") + ws() + value + ws();
    return g.literal("{") + ws() + Seq{g.rule_of({member + g.star(g.literal(",") + ws() + member), {}})} + g.literal("}");
  }

  // Any JSON value.
  Seq value() {
    if (!value_) {
      const uint32_t r = g.new_rule();
      value_ = Symbol{Symbol::kRule, r};
      for (const Seq& alt : {object_of({*value_}), array({*value_}, 0, -1), string(0, -1), number(), g.literal("true"),
                             g.literal("false"), g.literal("null")}) {
        g.add_alternative(r, alt);
      }
    }
    return {*value_};
  }

  Seq object() { return object_of(value()); }

  Seq schema(const json& s, const std::string& at) {
    if (g.rule_count() > kMaxRules) throw SchemaError(at + ": the schema is too large (over " + std::to_string(kMaxRules) + " grammar rules)");
    if (s.is_boolean()) {
      if (s.get<bool>()) return value();
      throw SchemaError(at + ": the schema false matches nothing");
    }
    if (!s.is_object()) throw SchemaError(at + ": a schema must be an object or a boolean");
    for (const auto& [key, _] : s.items()) {
      if (!supported().count(key) && !annotations().count(key)) {
        throw SchemaError(at + ": keyword '" + key + "' is not supported by structured output (supported: type, properties, "
                          "required, additionalProperties false, items, minItems, maxItems, minLength, maxLength, enum, "
                          "const, anyOf, $ref)");
      }
    }
    if (s.contains("$ref")) return reference(s, at);
    if (s.contains("const")) return g.literal(s["const"].dump());
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) throw SchemaError(at + ".enum: must be a non-empty list");
      std::vector<Seq> alts;
      for (const json& v : s["enum"]) alts.push_back(g.literal(v.dump()));
      return {g.rule_of(alts)};
    }
    if (s.contains("anyOf")) return any_of(s["anyOf"], at + ".anyOf");
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array() || s["allOf"].size() != 1) {
        throw SchemaError(at + ".allOf: only allOf of one schema is supported");
      }
      return schema(s["allOf"][0], at + ".allOf[0]");
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) return typed(s, t.get<std::string>(), at);
      if (!t.is_array() || t.empty()) throw SchemaError(at + ".type: must be a type name or a non-empty list of them");
      std::vector<Seq> alts;
      for (const json& one : t) {
        if (!one.is_string()) throw SchemaError(at + ".type: must be a type name or a non-empty list of them");
        alts.push_back(typed(s, one.get<std::string>(), at));
      }
      return {g.rule_of(alts)};
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) return typed(s, "object", at);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", at);
    if (s.contains("minLength") || s.contains("maxLength")) return typed(s, "string", at);
    return value();  // {}: any JSON value
  }

 private:
  Seq any_of(const json& list, const std::string& at) {
    if (!list.is_array() || list.empty()) throw SchemaError(at + ": must be a non-empty list of schemas");
    std::vector<Seq> alts;
    for (size_t i = 0; i < list.size(); ++i) alts.push_back(schema(list[i], at + "[" + std::to_string(i) + "]"));
    return {g.rule_of(alts)};
  }

  Seq reference(const json& s, const std::string& at) {
    if (!s["$ref"].is_string()) throw SchemaError(at + ".$ref: must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    auto it = refs_.find(ref);
    if (it != refs_.end()) return {Symbol{Symbol::kRule, it->second}};
    const json* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      const std::string section = p.substr(2, p.size() - 3);
      if (ref.rfind(p, 0) == 0 && root_.contains(section) && root_[section].is_object() && root_[section].contains(ref.substr(p.size()))) {
        target = &root_[section][ref.substr(p.size())];
      }
    }
    if (ref == "#") target = &root_;
    if (!target) throw SchemaError(at + ".$ref: '" + ref + "' is not #, #/$defs/NAME or #/definitions/NAME of this schema");
    const uint32_t r = g.new_rule();  // before its body: a recursive reference finds it
    refs_[ref] = r;
    g.add_alternative(r, schema(*target, ref));
    return {Symbol{Symbol::kRule, r}};
  }

  static int64_t count(const json& s, const char* key, int64_t fallback, const std::string& at) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw SchemaError(at + "." + key + ": must be a non-negative integer");
    if (v.get<int64_t>() > kMaxRepeat) {
      throw SchemaError(at + "." + key + ": " + v.dump() + " exceeds this server's limit " + std::to_string(kMaxRepeat));
    }
    return v.get<int64_t>();
  }

  Seq typed(const json& s, const std::string& type, const std::string& at) {
    if (type == "string") {
      const int64_t lo = count(s, "minLength", 0, at), hi = count(s, "maxLength", -1, at);
      if (hi >= 0 && hi < lo) throw SchemaError(at + ": maxLength < minLength");
      return string(lo, hi);
    }
    if (type == "integer") return integer();
    if (type == "number") return number();
    if (type == "boolean") return {g.rule_of({g.literal("true"), g.literal("false")})};
    if (type == "null") return g.literal("null");
    if (type == "array") {
      const int64_t lo = count(s, "minItems", 0, at), hi = count(s, "maxItems", -1, at);
      if (hi >= 0 && hi < lo) throw SchemaError(at + ": maxItems < minItems");
      const Seq item = s.contains("items") ? schema(s["items"], at + ".items") : value();
      return array(item, lo, hi);
    }
    if (type == "object") return object_schema(s, at);
    throw SchemaError(at + ".type: '" + type + "' is not a JSON Schema type");
  }

  Seq object_schema(const json& s, const std::string& at) {
    const bool has_properties = s.contains("properties") && !s["properties"].empty();
    const json extra = s.contains("additionalProperties") ? s["additionalProperties"] : json(nullptr);
    if (!has_properties) {
      if (s.contains("required") && !s["required"].empty()) throw SchemaError(at + ".required: names properties the schema does not list");
      if (extra.is_boolean() && !extra.get<bool>()) return g.literal("{") + ws() + g.literal("}");
      return extra.is_object() ? object_of(schema(extra, at + ".additionalProperties")) : object();
    }
    if (!s["properties"].is_object()) throw SchemaError(at + ".properties: must be an object");
    if (!(extra.is_null() || (extra.is_boolean() && !extra.get<bool>()))) {
      throw SchemaError(at + ".additionalProperties: only false (or absent) is supported beside properties");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw SchemaError(at + ".required: must be a list of property names");
      for (const json& r : s["required"]) {
        if (!r.is_string() || !s["properties"].contains(r.get<std::string>())) {
          throw SchemaError(at + ".required: " + r.dump() + " is not one of the properties");
        }
        required.insert(r.get<std::string>());
      }
    }
    struct Property {
      Seq key_value;  // "name" ws ":" ws value ws
      bool required;
    };
    std::vector<Property> props;
    for (const auto& [name, sub] : s["properties"].items()) {
      props.push_back({g.literal(json(name).dump()) + ws() + g.literal(":") + ws() +
                           schema(sub, at + ".properties." + name) + ws(),
                       required.count(name) > 0});
    }
    // tail[i][first]: properties i.. in order, `first` when none came before (no comma): a required one always, an
    // optional one or not.
    const size_t n = props.size();
    std::vector<std::array<Seq, 2>> tail(n + 1);
    for (size_t i = n; i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        const Seq entry = (first ? Seq{} : g.literal(",") + ws()) + props[i].key_value + tail[i + 1][0];
        tail[i][first] = props[i].required ? entry : Seq{g.rule_of({entry, tail[i + 1][first]})};
      }
    }
    return g.literal("{") + ws() + tail[0][1] + g.literal("}");
  }

  const json& root_;
  std::map<std::string, uint32_t> refs_;
  std::optional<Symbol> ws_, char_, string_, integer_, number_, value_;
};

}  // namespace

Grammar json_schema_grammar(const json& schema, const std::string& where) {
  Compiler c(schema);
  const Seq top = c.schema(schema, where);
  const uint32_t root = c.g.new_rule();
  c.g.add_alternative(root, top);
  c.g.set_root(root);
  return std::move(c.g);
}

Grammar json_object_grammar() {
  const json any = json::object();
  Compiler c(any);
  const Seq top = c.object();
  const uint32_t root = c.g.new_rule();
  c.g.add_alternative(root, top);
  c.g.set_root(root);
  return std::move(c.g);
}

}  // namespace structured
