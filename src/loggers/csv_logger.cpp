// loom::CsvLogger (include/loom/loggers/csv_logger.hpp).
#include <loom/loggers/csv_logger.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include <loom/error.hpp>

namespace fs = std::filesystem;

namespace loom::loggers {

namespace detail {

namespace {

/// One more than the largest version_N under `base` (0 if none).
int64_t next_version(const fs::path& base) {
  int64_t version = 0;
  std::error_code ec;
  if (fs::is_directory(base, ec)) {
    for (const auto& e : fs::directory_iterator(base, ec)) {
      const auto n = e.path().filename().string();
      if (!e.is_directory(ec) || n.rfind("version_", 0) != 0 || n.size() == 8) continue;
      if (!std::all_of(n.begin() + 8, n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      version = std::max<int64_t>(version, std::stoll(n.substr(8)) + 1);
    }
  }
  return version;
}

}  // namespace

LogDir::LogDir(const fs::path& root, const LogDirOptions& options, const char* owner)
    : base_(options.name.empty() ? root : root / options.name),
      owner_(owner),
      version_(options.version) {
  if (version_ && *version_ < 0) throw Error("loom: a logger's version must be >= 0");
}

int64_t LogDir::version() const {
  if (!version_) version_ = next_version(base_);
  return *version_;
}

const fs::path& LogDir::path() const {
  if (path_.empty()) path_ = base_ / ("version_" + std::to_string(version()));
  return path_;
}

const fs::path& LogDir::make() {
  if (made_) return path_;
  const fs::path& dir = path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(std::string(owner_) + ": cannot create " + dir.string() + ": " + ec.message());
  made_ = true;
  return dir;
}

const fs::path& LogDir::switch_to(int64_t version) {
  if (version < 0) throw Error(std::string(owner_) + ": a resumed version must be >= 0");
  if (made_ && version_ == version) return path_;
  if (made_) {  // the folder this run made before it knew: removed if nothing is in it
    std::error_code ec;
    if (fs::is_directory(path_, ec) && fs::is_empty(path_, ec)) fs::remove(path_, ec);
  }
  version_ = version;
  path_.clear();
  made_ = false;
  return make();
}

std::string python_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, as Python's repr takes them.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const auto epos = s.find('e');
  const int exp = std::stoi(s.substr(epos + 1));
  std::string digits = s.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exp < -4 || exp >= 16) {  // Python's repr: scientific outside 1e-4 <= |v| < 1e16
    out.assign(digits, 0, 1);
    if (n > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  } else if (exp < 0) {
    out.assign("0.");
    out.append(static_cast<std::size_t>(-exp - 1), '0');
    out.append(digits);
  } else if (n <= exp + 1) {
    out.assign(digits);
    out.append(static_cast<std::size_t>(exp + 1 - n), '0');
    out.append(".0");
  } else {
    const auto point = static_cast<std::size_t>(exp + 1);
    out.assign(digits, 0, point);
    out.push_back('.');
    out.append(digits, point);
  }
  out.insert(0, sign);
  return out;
}

}  // namespace detail

namespace {

/// A field as Python's csv module writes it (QUOTE_MINIMAL).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

/// The fields of one CSV record from `in` (quoted fields may hold line ends); false at the end.
bool read_record(std::istream& in, std::vector<std::string>& fields) {
  fields.clear();
  if (in.peek() == std::char_traits<char>::eof()) return false;
  std::string f;
  bool quoted = false;
  for (int c = in.get(); c != std::char_traits<char>::eof(); c = in.get()) {
    if (quoted) {
      if (c == '"' && in.peek() == '"') {
        f += static_cast<char>(in.get());
      } else if (c == '"') {
        quoted = false;
      } else {
        f += static_cast<char>(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(f));
      f.clear();
    } else if (c == '\r' && in.peek() == '\n') {
      in.get();
      break;
    } else if (c == '\n') {
      break;
    } else {
      f += static_cast<char>(c);
    }
  }
  fields.push_back(std::move(f));
  return true;
}

std::string number_text(const MetricValue& v) {
  if (v.integral()) return std::to_string(static_cast<int64_t>(v.number()));
  return detail::python_repr(v.number());
}

void write_line(std::ostream& out, const std::vector<std::string>& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out << ',';
    out << csv_field(fields[i]);
  }
  out << "\r\n";
}

/// Replaces `path` by `text` whole: written beside it, then renamed over it.
void replace_file(const fs::path& path, const std::string& text) {
  const fs::path tmp(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error("loom::CsvLogger: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error("loom::CsvLogger: cannot write " + path.string() + ": " + ec.message());
}

/// A hyper-parameter as YAML (the way PyYAML writes Lightning's hparams.yaml).
std::string yaml_value(const HyperValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    if (std::isnan(*d)) return ".nan";
    if (std::isinf(*d)) return *d > 0 ? ".inf" : "-.inf";
    std::string s = detail::python_repr(*d);
    const auto e = s.find('e');
    if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
    return s;
  }
  const auto& s = std::get<std::string>(v);
  static const std::set<std::string> words{
      "true", "false", "yes",  "no",   "on",    "off", "null", "True", "False", "Yes",  "No",
      "On",   "Off",   "Null", "TRUE", "FALSE", "YES", "NO",   "ON",   "OFF",   "NULL", "~"};
  // Plain where YAML reads it back as this string: safe characters, not a YAML word, not a
  // number ("32-true" is plain, "1e5" and "0.5" are quoted).
  char* end = nullptr;
  const bool number = !s.empty() && (std::strtod(s.c_str(), &end), *end == '\0');
  const bool plain =
      !s.empty() && !words.count(s) && !number &&
      (std::isalnum(static_cast<unsigned char>(s[0])) || s[0] == '_' || s[0] == '/') &&
      std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
               c == '/';
      });
  if (plain) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

}  // namespace

CsvLogger::CsvLogger(fs::path root_dir, const LogDirOptions& options)
    : Logger(LoggerOptions{options.flush_every, options.rank}),
      dir_(root_dir, options, "loom::CsvLogger"),
      continue_on_resume_(options.continue_on_resume) {}

void CsvLogger::open() {
  if (dir_.made()) return;
  dir_.make();
  if (fs::exists(metrics_file())) {  // a version given again: go on after its rows
    std::ifstream in(metrics_file(), std::ios::binary);
    std::vector<std::string> header;
    if (read_record(in, header) && !(header.size() == 1 && header[0].empty())) keys_ = header;
  }
}

void CsvLogger::continue_version(int64_t version, int64_t step) {
  if (!writes() || !continue_on_resume_) return;
  flush();
  dir_.switch_to(version);
  keys_.clear();
  const auto path = metrics_file();
  if (!fs::exists(path)) return;
  // The rows of steps after `step`, written after the checkpoint and before the stop, go:
  // the resumed run logs those steps again.
  std::ostringstream text;
  std::vector<std::string> header, fields;
  {
    std::ifstream in(path, std::ios::binary);
    if (!read_record(in, header) || (header.size() == 1 && header[0].empty())) return;
    const auto s = std::find(header.begin(), header.end(), "step") - header.begin();
    write_line(text, header);
    while (read_record(in, fields)) {
      const auto at = static_cast<std::size_t>(s);
      if (at < fields.size() && !fields[at].empty() &&
          fields[at].find_first_not_of("0123456789-") == std::string::npos &&
          std::stoll(fields[at]) > step) {
        continue;
      }
      write_line(text, fields);
    }
  }
  replace_file(path, text.str());
  keys_ = header;
}

void CsvLogger::write_rows(const std::vector<Row>& rows) {
  open();
  std::vector<std::string> keys = keys_;
  for (const auto& row : rows) {
    for (const auto& [name, v] : row.values) {
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) keys.push_back(name);
    }
  }
  if (std::find(keys.begin(), keys.end(), "step") == keys.end()) keys.push_back("step");
  std::sort(keys.begin(), keys.end());
  const auto path = metrics_file();
  const bool exists = fs::exists(path);

  std::ostringstream text;
  if (!exists || keys != keys_) {
    // A new header: the rows written so far go under it again (Lightning rewrites the file).
    write_line(text, keys);
    if (exists) {
      std::ifstream in(path, std::ios::binary);
      std::vector<std::string> old_keys, fields;
      read_record(in, old_keys);
      while (read_record(in, fields)) {
        std::vector<std::string> out(keys.size());
        for (std::size_t i = 0; i < old_keys.size() && i < fields.size(); ++i) {
          const auto at = std::find(keys.begin(), keys.end(), old_keys[i]) - keys.begin();
          out[static_cast<std::size_t>(at)] = fields[i];
        }
        write_line(text, out);
      }
    }
  }
  for (const auto& row : rows) {
    std::vector<std::string> out(keys.size());
    for (const auto& [name, v] : row.values) {
      out[static_cast<std::size_t>(std::find(keys.begin(), keys.end(), name) - keys.begin())] =
          number_text(v);
    }
    const auto s = std::find(keys.begin(), keys.end(), "step") - keys.begin();
    // Lightning's row dict gets "step" last: a metric named "step" is replaced by the step.
    out[static_cast<std::size_t>(s)] = std::to_string(row.step);
    write_line(text, out);
  }

  if (!exists || keys != keys_) {
    replace_file(path, text.str());
  } else {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << text.str();
    out.flush();
    if (!out) throw Error("loom::CsvLogger: cannot write " + path.string());
  }
  keys_ = std::move(keys);
}

void CsvLogger::write_hyperparams(const Hyperparams& params) {
  open();
  detail::write_hparams_yaml(log_dir() / "hparams.yaml", params);
}

void detail::write_hparams_yaml(const fs::path& file, const Hyperparams& params) {
  std::map<std::string, std::string> sorted;  // PyYAML sorts the keys
  for (const auto& [k, v] : params) sorted[k] = yaml_value(v);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  for (const auto& [k, v] : sorted) out << k << ": " << v << "\n";
  out.flush();
  if (!out) throw Error("loom: cannot write " + file.string());
}

}  // namespace loom::loggers
