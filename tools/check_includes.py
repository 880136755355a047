#!/usr/bin/env python3
"""tools/check_includes.py: every Kiln source file includes, by name, the standard header of every
standard-library name it uses ("include what you use", for the standard library only).

A file that uses uint8_t and compiles only because <string> happened to pull in <cstdint> breaks
on the next compiler: libstdc++ 13 and libc++ 16 both dropped transitive includes of that kind
(https://gcc.gnu.org/gcc-13/porting_to.html, "Header dependency changes"). This check is a table
of standard names (std::string, uint8_t, std::min, FLT_MAX, ...) and the headers that the C++17
standard says declare them; each file is scanned with its comments, string and character
literals blanked out, and a name used without one of its headers included is reported:

    engine/device.h:12: uses uint8_t but does not include <cstdint>

The rules it applies:
  * A name may come from any header the standard specifies to declare it (size_t: <cstddef>,
    <cstdio>, <cstdlib>, <cstring>, <ctime>, <cwchar>; std::size: <iterator> or a container's
    header; ...), and a <cname> header's name may come from <name.h> too.
  * A foo.cpp (or foo.cu) may rely on the standard headers that its own foo.h (or foo.cuh),
    included by name, includes directly: the Google C++ Style Guide's rule
    (https://google.github.io/styleguide/cppguide.html#Include_What_You_Use).
  * A range-for over a braced list, `for (x : {a, b})`, uses std::initializer_list: it needs
    <initializer_list> or a header specified to include it (<vector>, <string>, <utility>, ...).
  * Unqualified C math functions (expf, sqrtf, ...) are not checked: in .cu files they are CUDA's
    device functions, which nvcc (or the simulator's runtime header) provides. std::sqrt and
    friends are checked.
  * Names whose header cannot be told from the name alone (std::get, std::begin on a
    user type, ...) are not checked; clang with libc++ and -D_LIBCPP_REMOVE_TRANSITIVE_INCLUDES
    (tools/check_headers_alone.sh) covers what the table does not, for headers.

Usage:
  tools/check_includes.py [--root DIR] [--fix] [PATH...]
    PATH     files or directories to check (default: engine layers comm data models apps tests
             examples tools under the root); *.h, *.cuh, *.cpp, *.cu files are checked
    --root   the tree the default paths and the includes "dir/file.h" are relative to (default:
             the repository this script is in)
    --fix    add the missing includes to each file's block of standard headers (kept sorted),
             or make one; then report what is still missing (nothing, normally)
Exit codes: 0 nothing missing; 1 something missing (listed); 2 bad usage.
"""
import os
import re
import sys

SOURCE_DIRS = ["engine", "layers", "comm", "data", "models", "apps", "tests", "examples", "tools"]
EXTENSIONS = (".h", ".cuh", ".cpp", ".cu")

# ---- the table ----------------------------------------------------------------------------------
# Each rule: (headers, kind, names). headers: the first is the one a report names; any of them
# satisfies the rule. kind "std": the names are matched as std::NAME. kind "global": as NAME,
# unqualified or qualified by std:: or :: (the C names C++ also has in the global namespace, and
# macros); a NAME after ".", "->" or another namespace's "::" is someone else's.

# Headers the standard specifies to #include <initializer_list> ([support.initlist] and each
# header's synopsis in C++17).
INITIALIZER_LIST_HEADERS = ["initializer_list", "utility", "string", "array", "deque", "forward_list",
                            "list", "vector", "map", "set", "unordered_map", "unordered_set", "queue",
                            "stack", "algorithm", "random", "valarray", "regex"]
# [iterator.range]: std::begin, std::size, ... are also available from these.
ITERATOR_RANGE_HEADERS = ["iterator", "array", "deque", "forward_list", "list", "map", "regex", "set",
                          "string", "string_view", "unordered_map", "unordered_set", "vector"]
# [support.types.layout], [cstdio.syn], [cstdlib.syn], [cstring.syn], [ctime.syn], [cwchar.syn]
SIZE_T_HEADERS = ["cstddef", "cstdio", "cstdlib", "cstring", "ctime", "cwchar", "cuchar"]
IOS_HEADERS = ["ios", "iostream", "istream", "ostream", "sstream", "fstream", "iomanip"]

RULES = [
    (["cstdint", "cinttypes"], "global", r"""
        int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t
        int_least8_t int_least16_t int_least32_t int_least64_t
        uint_least8_t uint_least16_t uint_least32_t uint_least64_t
        int_fast8_t int_fast16_t int_fast32_t int_fast64_t
        uint_fast8_t uint_fast16_t uint_fast32_t uint_fast64_t
        intptr_t uintptr_t intmax_t uintmax_t
        INT8_MIN INT16_MIN INT32_MIN INT64_MIN INT8_MAX INT16_MAX INT32_MAX INT64_MAX
        UINT8_MAX UINT16_MAX UINT32_MAX UINT64_MAX INTPTR_MAX UINTPTR_MAX SIZE_MAX PTRDIFF_MAX
        INT64_C UINT64_C INT32_C UINT32_C"""),
    (["cinttypes"], "global", "PRId8 PRId16 PRId32 PRId64 PRIu8 PRIu16 PRIu32 PRIu64 PRIx32 PRIx64 "
                              "PRIX64 SCNd64 SCNu64"),
    (SIZE_T_HEADERS, "global", "size_t"),
    (SIZE_T_HEADERS + ["clocale"], "global", "NULL"),
    (["cstddef"], "global", "ptrdiff_t max_align_t nullptr_t offsetof"),
    (["cstddef"], "std", "byte to_integer"),
    (["climits"], "global", "CHAR_BIT CHAR_MIN CHAR_MAX SCHAR_MIN SCHAR_MAX UCHAR_MAX SHRT_MIN SHRT_MAX "
                            "USHRT_MAX INT_MIN INT_MAX UINT_MAX LONG_MIN LONG_MAX ULONG_MAX LLONG_MIN "
                            "LLONG_MAX ULLONG_MAX"),
    (["cfloat"], "global", "FLT_MAX FLT_MIN FLT_EPSILON FLT_TRUE_MIN FLT_DIG FLT_MANT_DIG FLT_MAX_EXP "
                           "DBL_MAX DBL_MIN DBL_EPSILON DBL_TRUE_MIN DBL_DIG DBL_MANT_DIG DBL_MAX_EXP "
                           "LDBL_MAX LDBL_MIN LDBL_EPSILON"),
    (["cmath"], "global", "INFINITY NAN HUGE_VAL HUGE_VALF M_PI M_E M_SQRT2 M_LN2"),
    (["cmath"], "std", """
        sqrt cbrt exp exp2 expm1 log log2 log10 log1p pow fabs floor ceil round lround llround
        trunc fmod remainder sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh
        erf erfc tgamma lgamma isnan isinf isfinite isnormal signbit copysign fma fmax fmin fdim
        nextafter nexttoward hypot nearbyint rint lrint llrint ldexp frexp modf scalbn ilogb logb
        fpclassify float_t double_t"""),
    (["cmath", "cstdlib"], "std", "abs"),
    (["cstdlib"], "std", """
        getenv atoi atol atoll atof strtol strtoll strtoul strtoull strtod strtof strtold exit
        abort _Exit quick_exit atexit malloc calloc realloc free aligned_alloc system rand srand
        qsort bsearch div ldiv llabs labs"""),
    (["cstdlib"], "global", "EXIT_SUCCESS EXIT_FAILURE RAND_MAX"),
    (["cstring"], "std", """
        memcpy memmove memset memcmp memchr strlen strcmp strncmp strcpy strncpy strcat strncat
        strchr strrchr strstr strspn strcspn strpbrk strerror strtok strcoll"""),
    (["cstring"], "global", "memcpy memmove memset memcmp strlen strcmp strncmp strcpy strncpy strchr "
                            "strrchr strstr strerror"),
    (["cstdio"], "std", """
        printf fprintf snprintf sprintf vsnprintf vfprintf vprintf puts fputs fputc putc putchar
        fgets fgetc getc getchar fopen freopen fclose fread fwrite fflush fseek ftell rewind
        feof ferror clearerr perror rename tmpfile setvbuf sscanf fscanf scanf FILE fpos_t"""),
    (["cstdio"], "global", "printf fprintf snprintf sprintf vsnprintf vfprintf puts fputs fputc putchar "
                           "fopen fclose fread fwrite fflush fseek ftell perror sscanf fscanf FILE "
                           "stderr stdout stdin EOF BUFSIZ"),
    (["cstdio", "algorithm"], "std", "remove"),
    (["cctype", "locale"], "std", "isalnum isalpha isblank iscntrl isdigit isgraph islower isprint "
                                  "ispunct isspace isupper isxdigit tolower toupper"),
    (["cerrno"], "global", "errno EINTR EAGAIN EEXIST ENOENT EINVAL ERANGE EDOM ENOMEM EACCES EBADF "
                           "EPIPE ENOSPC EIO EBUSY ENOTDIR EISDIR ETIMEDOUT ECONNREFUSED ECONNRESET"),
    (["cassert"], "global", "assert"),
    (["csignal"], "std", "signal raise sig_atomic_t"),
    (["csignal"], "global", "SIGINT SIGTERM SIGABRT SIGSEGV SIGFPE SIGILL SIG_DFL SIG_IGN SIG_ERR "
                            "sig_atomic_t"),
    (["cstdarg"], "global", "va_list va_start va_end va_copy va_arg"),
    (["csetjmp"], "global", "setjmp longjmp jmp_buf"),
    (["ctime"], "std", "time time_t clock clock_t tm localtime gmtime mktime difftime strftime "
                       "timespec asctime ctime"),
    (["ctime"], "global", "CLOCKS_PER_SEC"),
    (["string"], "std", "string basic_string wstring u16string u32string to_string to_wstring stoi "
                        "stol stoll stoul stoull stof stod stold char_traits"),
    (["string", "istream"], "std", "getline"),
    (["string_view"], "std", "string_view basic_string_view"),
    (["vector"], "std", "vector"),
    (["array"], "std", "array"),
    (["deque"], "std", "deque"),
    (["list"], "std", "list"),
    (["forward_list"], "std", "forward_list"),
    (["map"], "std", "map multimap"),
    (["set"], "std", "set multiset"),
    (["unordered_map"], "std", "unordered_map unordered_multimap"),
    (["unordered_set"], "std", "unordered_set unordered_multiset"),
    (["queue"], "std", "queue priority_queue"),
    (["stack"], "std", "stack"),
    (["bitset"], "std", "bitset"),
    (["tuple"], "std", "tuple make_tuple tie forward_as_tuple tuple_cat apply make_from_tuple "
                       "tuple_size tuple_element ignore"),
    (["utility"], "std", "pair make_pair move forward swap exchange declval as_const move_if_noexcept "
                         "integer_sequence index_sequence make_index_sequence make_integer_sequence "
                         "index_sequence_for in_place in_place_t in_place_type in_place_index "
                         "piecewise_construct rel_ops"),
    (["optional"], "std", "optional nullopt nullopt_t make_optional bad_optional_access"),
    (["variant"], "std", "variant visit holds_alternative get_if monostate variant_size "
                         "variant_alternative bad_variant_access"),
    (["any"], "std", "any any_cast make_any bad_any_cast"),
    (["memory"], "std", "unique_ptr make_unique shared_ptr make_shared weak_ptr enable_shared_from_this "
                        "allocate_shared default_delete allocator allocator_traits pointer_traits "
                        "addressof align static_pointer_cast dynamic_pointer_cast const_pointer_cast "
                        "reinterpret_pointer_cast owner_less uninitialized_copy uninitialized_fill "
                        "uninitialized_fill_n uninitialized_copy_n destroy_at destroy"),
    (["new"], "std", "bad_alloc bad_array_new_length nothrow nothrow_t launder align_val_t "
                     "hardware_destructive_interference_size hardware_constructive_interference_size "
                     "set_new_handler get_new_handler"),
    (["functional"], "std", "function bind ref cref reference_wrapper invoke mem_fn not_fn plus minus "
                            "multiplies divides modulus negate equal_to not_equal_to greater less "
                            "greater_equal less_equal logical_and logical_or logical_not bit_and "
                            "bit_or bit_xor bad_function_call placeholders identity"),
    (["functional", "string", "string_view", "memory", "optional", "variant", "vector", "bitset",
      "system_error", "thread", "typeindex"], "std", "hash"),
    (["algorithm"], "std", """
        min max minmax min_element max_element minmax_element clamp sort stable_sort partial_sort
        partial_sort_copy nth_element is_sorted is_sorted_until find find_if find_if_not find_end
        find_first_of adjacent_find count count_if copy copy_n copy_if copy_backward move_backward
        fill fill_n transform generate generate_n replace replace_if replace_copy replace_copy_if
        remove_if remove_copy remove_copy_if unique unique_copy reverse reverse_copy rotate
        rotate_copy shuffle sample lower_bound upper_bound equal_range binary_search merge
        inplace_merge includes set_union set_intersection set_difference set_symmetric_difference
        push_heap pop_heap make_heap sort_heap is_heap is_heap_until lexicographical_compare
        next_permutation prev_permutation is_permutation all_of any_of none_of for_each for_each_n
        mismatch equal search search_n partition stable_partition partition_copy partition_point
        is_partitioned swap_ranges iter_swap"""),
    (["numeric"], "std", "accumulate iota inner_product partial_sum adjacent_difference gcd lcm reduce "
                         "transform_reduce exclusive_scan inclusive_scan transform_exclusive_scan "
                         "transform_inclusive_scan"),
    (["iterator"], "std", "back_inserter front_inserter inserter back_insert_iterator insert_iterator "
                          "next prev advance distance iterator_traits reverse_iterator "
                          "make_reverse_iterator move_iterator make_move_iterator istream_iterator "
                          "ostream_iterator istreambuf_iterator ostreambuf_iterator input_iterator_tag "
                          "output_iterator_tag forward_iterator_tag bidirectional_iterator_tag "
                          "random_access_iterator_tag"),
    (ITERATOR_RANGE_HEADERS, "std", "begin end cbegin cend rbegin rend crbegin crend size ssize empty "
                                    "data"),
    (["initializer_list"], "std", "initializer_list"),
    (["limits"], "std", "numeric_limits float_round_style float_denorm_style"),
    (["type_traits"], "std", """
        integral_constant bool_constant true_type false_type enable_if enable_if_t conditional
        conditional_t decay decay_t void_t conjunction disjunction negation underlying_type
        underlying_type_t common_type common_type_t invoke_result invoke_result_t result_of
        result_of_t make_signed make_signed_t make_unsigned make_unsigned_t remove_cv remove_cv_t
        remove_const remove_const_t remove_volatile remove_volatile_t remove_reference
        remove_reference_t remove_pointer remove_pointer_t remove_extent remove_extent_t
        remove_all_extents remove_all_extents_t remove_cvref remove_cvref_t add_const add_const_t
        add_cv add_cv_t add_volatile add_volatile_t add_pointer add_pointer_t add_lvalue_reference
        add_lvalue_reference_t add_rvalue_reference add_rvalue_reference_t aligned_storage
        aligned_storage_t aligned_union alignment_of rank extent is_void is_null_pointer
        is_integral is_floating_point is_array is_enum is_union is_class is_function is_pointer
        is_lvalue_reference is_rvalue_reference is_member_pointer is_member_object_pointer
        is_member_function_pointer is_fundamental is_arithmetic is_scalar is_object is_compound
        is_reference is_const is_volatile is_trivial is_trivially_copyable is_standard_layout
        is_pod is_empty is_polymorphic is_abstract is_final is_aggregate is_signed is_unsigned
        is_constructible is_default_constructible is_copy_constructible is_move_constructible
        is_assignable is_copy_assignable is_move_assignable is_destructible
        is_trivially_constructible is_trivially_default_constructible
        is_trivially_copy_constructible is_trivially_move_constructible
        is_trivially_assignable is_trivially_copy_assignable is_trivially_move_assignable
        is_trivially_destructible is_nothrow_constructible is_nothrow_default_constructible
        is_nothrow_copy_constructible is_nothrow_move_constructible is_nothrow_assignable
        is_nothrow_copy_assignable is_nothrow_move_assignable is_nothrow_destructible
        is_nothrow_swappable is_swappable has_virtual_destructor has_unique_object_representations
        is_same is_base_of is_convertible is_invocable is_invocable_r is_nothrow_invocable
        is_same_v is_integral_v is_floating_point_v is_enum_v is_signed_v is_unsigned_v
        is_pointer_v is_arithmetic_v is_trivially_copyable_v is_base_of_v is_convertible_v
        is_constructible_v is_invocable_v is_void_v is_class_v is_reference_v is_const_v
        is_standard_layout_v is_trivially_destructible_v is_nothrow_move_constructible_v
        is_default_constructible_v is_copy_constructible_v is_move_constructible_v
        is_lvalue_reference_v is_array_v is_empty_v is_polymorphic_v is_scalar_v
        is_constant_evaluated"""),
    (["typeinfo"], "std", "type_info bad_cast bad_typeid"),
    (["typeinfo"], "global", "typeid"),
    (["typeindex"], "std", "type_index"),
    (["stdexcept"], "std", "logic_error domain_error invalid_argument length_error out_of_range "
                           "runtime_error range_error overflow_error underflow_error"),
    (["exception"], "std", "exception exception_ptr current_exception rethrow_exception "
                           "make_exception_ptr nested_exception throw_with_nested rethrow_if_nested "
                           "terminate set_terminate uncaught_exceptions bad_exception"),
    (["system_error"], "std", "system_error error_code error_condition errc error_category "
                              "generic_category system_category make_error_code"),
    (["chrono"], "std", "chrono"),
    (["ratio", "chrono"], "std", "ratio nano micro milli centi deci kilo mega giga ratio_add "
                                 "ratio_multiply ratio_divide"),
    (["thread"], "std", "thread this_thread"),
    (["mutex"], "std", "mutex recursive_mutex timed_mutex lock_guard unique_lock scoped_lock "
                       "once_flag call_once try_lock lock defer_lock adopt_lock try_to_lock"),
    (["shared_mutex"], "std", "shared_mutex shared_lock shared_timed_mutex"),
    (["condition_variable"], "std", "condition_variable condition_variable_any cv_status"),
    (["future"], "std", "future shared_future promise packaged_task async launch future_status "
                        "future_error"),
    (["atomic"], "std", "atomic atomic_flag atomic_thread_fence atomic_signal_fence memory_order "
                        "memory_order_relaxed memory_order_acquire memory_order_release "
                        "memory_order_acq_rel memory_order_seq_cst memory_order_consume atomic_int "
                        "atomic_bool atomic_size_t atomic_uint64_t atomic_int64_t"),
    (["filesystem"], "std", "filesystem"),
    (["random"], "std", "mt19937 mt19937_64 minstd_rand minstd_rand0 default_random_engine "
                        "random_device seed_seq uniform_int_distribution uniform_real_distribution "
                        "normal_distribution bernoulli_distribution discrete_distribution "
                        "exponential_distribution poisson_distribution lognormal_distribution "
                        "gamma_distribution binomial_distribution geometric_distribution "
                        "generate_canonical ranlux24 ranlux48 knuth_b"),
    (["complex"], "std", "complex"),
    (["valarray"], "std", "valarray"),
    (["regex"], "std", "regex regex_match regex_search regex_replace smatch cmatch sregex_iterator"),
    (["sstream"], "std", "stringstream ostringstream istringstream basic_stringstream "
                         "basic_ostringstream basic_istringstream stringbuf"),
    (["fstream"], "std", "ifstream ofstream fstream basic_ifstream basic_ofstream basic_fstream filebuf"),
    (["iostream"], "std", "cout cerr cin clog wcout wcerr"),
    (["ostream", "iostream", "sstream", "fstream"], "std", "ostream basic_ostream endl ends flush"),
    (["istream", "iostream", "sstream", "fstream"], "std", "istream basic_istream iostream ws"),
    (["iomanip"], "std", "setw setprecision setfill setbase put_time get_time quoted put_money "
                         "get_money resetiosflags setiosflags"),
    (IOS_HEADERS, "std", "ios ios_base streamsize streamoff fixed scientific hexfloat defaultfloat hex "
                         "dec oct boolalpha noboolalpha showpoint noshowpoint showpos left right "
                         "internal uppercase nouppercase skipws noskipws unitbuf"),
    (["streambuf"], "std", "streambuf basic_streambuf"),
    (["clocale"], "std", "setlocale localeconv lconv"),
    (["locale"], "std", "locale use_facet has_facet"),
    (["cwchar"], "std", "wcslen wmemcpy mbstate_t"),
]


def _compile_rules():
    """{"std": {name: (shown, headers)}, "global": {...}} and one regex per kind that finds them."""
    table = {"std": {}, "global": {}}
    for headers, kind, names in RULES:
        for name in names.split():
            assert name not in table[kind], "check_includes.py: %s is in the table twice" % name
            table[kind][name] = ("std::" + name if kind == "std" else name, tuple(headers))
    alternation = lambda names: "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    patterns = {"std": re.compile(r"\bstd\s*::\s*(" + alternation(table["std"]) + r")\b"),
                "global": re.compile(r"\b(" + alternation(table["global"]) + r")\b")}
    return table, patterns


TABLE, PATTERNS = _compile_rules()
# A range-for over a braced list: `for (decl : {` (no ';' inside the parentheses: not a for(;;)).
BRACED_RANGE_FOR = re.compile(r"\bfor\s*\(([^;(){}]|\([^;(){}]*\))*:\s*\{")

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(include|error|warning|pragma|line)\b.*$", re.M)


def blank_comments_and_literals(text):
    """The text with comments, string literals and character literals replaced by spaces
    (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)
    keep = lambda s: "".join(c if c == "\n" else " " for c in s)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 1  # a backslash-newline continues a // comment
                j += 1
            out.append(keep(text[i:j]))
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(keep(text[i:j]))
            i = j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + keep(text[i + 1:j - 1]) + c)
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            # A pp-number, digit separators (1'000) included.
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "._'" or
                             (text[j] in "+-" and text[j - 1] in "eEpP")):
                j += 1
            out.append(text[i:j])
            i = j
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            out.append(text[i:j])
            if text[i:j] in ("R", "u8R", "uR", "UR", "LR") and j < n and text[j] == '"':
                # A raw string literal: R"delim( ... )delim".
                k = text.find("(", j + 1)
                end = text.find(")" + text[j + 1:k] + '"', k + 1) if k >= 0 else -1
                e = n if end < 0 else end + (k - j) + 1
                out.append('"' + keep(text[j + 1:e - 1]) + '"')
                j = e
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def std_header(name):
    """A standard library header (no extension, no directory) or None."""
    return name if re.fullmatch(r"[a-z_]+", name) else None


def accepted(headers):
    """The header names that satisfy a rule: each header and, for <cname>, <name.h>."""
    out = set()
    for h in headers:
        out.add(h)
        if h.startswith("c") and h not in ("complex", "chrono", "charconv", "condition_variable", "codecvt",
                                             "compare", "concepts", "coroutine"):
            out.add(h[1:] + ".h")
    return out


class Source:
    def __init__(self, path, rel):
        self.path = path
        self.rel = rel
        with open(path, encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.code = blank_comments_and_literals(self.text)
        # The includes are read from the code (a commented-out #include does not count), with
        # the names from the original text (the lexer blanked the "..." of quoted includes).
        self.includes = []  # (kind '<' or '"', name, line number)
        text_lines = self.text.split("\n")
        for m in INCLUDE_RE.finditer(self.code):
            line = self.code.count("\n", 0, m.start()) + 1
            orig = INCLUDE_RE.match(text_lines[line - 1])
            if orig:
                self.includes.append((orig.group(1), orig.group(2).strip(), line))
        self.scan = DIRECTIVE_RE.sub(lambda m: " " * len(m.group(0)), self.code)

    def included_names(self):
        return {name for _, name, _ in self.includes}


def own_header(src, root):
    """The path of foo.cpp's / foo.cu's own header foo.h / foo.cuh when the file includes it."""
    stem, ext = os.path.splitext(os.path.basename(src.path))
    if ext not in (".cpp", ".cu"):
        return None
    for kind, name, _ in src.includes:
        if kind != '"':
            continue
        hstem, hext = os.path.splitext(os.path.basename(name))
        if hstem != stem or hext not in (".h", ".cuh"):
            continue
        for base in (os.path.dirname(src.path), root):
            cand = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(cand) and os.path.dirname(cand) == os.path.dirname(os.path.abspath(src.path)):
                return cand
    return None


def check(src, root):
    """[(line, shown name, header)] of what src uses without including it; the first use of
    each missing header."""
    have = src.included_names()
    own = own_header(src, root)
    if own:
        have |= Source(own, own).included_names()
    missing = {}  # header -> (line, name)
    code = src.scan
    line_of = lambda pos: code.count("\n", 0, pos) + 1
    found = []  # (position, shown name, headers)
    for kind in ("std", "global"):
        for m in PATTERNS[kind].finditer(code):
            shown, headers = TABLE[kind][m.group(1)]
            if kind == "global":
                before = code[max(0, m.start(1) - 80):m.start(1)].rstrip(" \t")
                if before.endswith(".") or before.endswith("->"):
                    continue  # a member
                if before.endswith("::"):
                    q = re.search(r"(\w*)\s*::$", before)
                    if q and q.group(1) not in ("", "std"):
                        continue  # another namespace's or class's name
            found.append((m.start(), shown, headers))
    for pos, shown, headers in sorted(found):
        if headers[0] not in missing and not have & accepted(headers):
            missing[headers[0]] = (line_of(pos), shown)
    if "initializer_list" not in missing and not have & accepted(INITIALIZER_LIST_HEADERS):
        m = BRACED_RANGE_FOR.search(code)
        if m:
            missing["initializer_list"] = (line_of(m.start()), "std::initializer_list (a range-for over {...})")
    return sorted((line, name, header) for header, (line, name) in missing.items())


# ---- --fix --------------------------------------------------------------------------------------
def fix(src, headers, root):
    """Adds #include <h> for each of headers to src's block of standard headers, kept sorted; a
    file without one gets a block after its system/third-party <...> includes (or after its own
    header, or before its first "..." include, or after #pragma once)."""
    lines = src.text.split("\n")
    code_lines = src.code.split("\n")
    depth, depths = 0, []
    for cl in code_lines:
        s = cl.strip()
        if re.match(r"#\s*if", s):
            depth += 1
        depths.append(depth)
        if re.match(r"#\s*endif", s):
            depth -= 1
    inc = {}  # line index -> (kind, name)
    for kind, name, line in src.includes:
        inc[line - 1] = (kind, name)
    is_std = lambda i: i in inc and inc[i][0] == "<" and std_header(inc[i][1]) and depths[i] == 0
    new = ["#include <%s>" % h for h in headers]
    # The first top-level run of standard includes.
    start = next((i for i in sorted(inc) if is_std(i)), None)
    if start is not None:
        end = start
        while end + 1 < len(lines) and is_std(end + 1):
            end += 1
        block = lines[start:end + 1] + new
        block.sort(key=lambda l: INCLUDE_RE.match(l).group(2))
        lines[start:end + 1] = block
    else:
        top = [i for i in sorted(inc) if depths[i] == 0]
        quoted = [i for i in top if inc[i][0] == '"']
        # The first run of top-level <...> (system, third-party) includes.
        run = [i for i in top if inc[i][0] == "<"][:1]
        while run and run[-1] + 1 in inc and inc[run[-1] + 1][0] == "<" and depths[run[-1] + 1] == 0:
            run.append(run[-1] + 1)
        own = own_header(src, root)
        first_alone = (bool(top) and inc[top[0]][0] == '"' and top[0] + 1 < len(lines) and not lines[top[0] + 1].strip()
                       and ((own and os.path.basename(own) == os.path.basename(inc[top[0]][1]))
                            or inc[top[0]][1].endswith("cuda/runtime.h")))
        if run and (len(quoted) < 2 or run[0] < quoted[1] or not first_alone):
            at = run[-1] + 1  # after the system headers
            lines[at:at] = [""] + new
        elif first_alone:
            at = top[0] + 1  # after the file's own header (or engine/cuda/runtime.h), alone first
            lines[at:at] = [""] + new
        elif quoted:
            at = quoted[0]
            lines[at:at] = new + [""]
        else:
            pragma = next((i for i, l in enumerate(lines) if l.strip() == "#pragma once"), None)
            if pragma is None:
                raise ValueError("%s: no #include and no #pragma once: add the includes by hand" % src.rel)
            lines[pragma + 1:pragma + 1] = [""] + new
    text = "\n".join(lines)
    text = re.sub(r"\n\n\n+(#include)", r"\n\n\1", text)
    with open(src.path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv):
    args = argv[1:]
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    do_fix = False
    paths = []
    while args:
        a = args.pop(0)
        if a == "--root":
            if not args:
                print("check_includes.py: --root needs a directory", file=sys.stderr)
                return 2
            root = os.path.abspath(args.pop(0))
            if not os.path.isdir(root):
                print("check_includes.py: --root %s: no such directory" % root, file=sys.stderr)
                return 2
        elif a == "--fix":
            do_fix = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif a.startswith("-"):
            print("check_includes.py: unknown option %s (see --help)" % a, file=sys.stderr)
            return 2
        else:
            paths.append(a)
    if not paths:
        paths = [os.path.join(root, d) for d in SOURCE_DIRS if os.path.isdir(os.path.join(root, d))]
    files = []
    for p in paths:
        if os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("build"))
                files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(EXTENSIONS)]
        elif os.path.isfile(p):
            if not p.endswith(EXTENSIONS):
                print("check_includes.py: %s: not a C++ or CUDA source (%s)" % (p, " ".join(EXTENSIONS)),
                      file=sys.stderr)
                return 2
            files.append(p)
        else:
            print("check_includes.py: %s: no such file or directory" % p, file=sys.stderr)
            return 2
    problems = 0
    for path in files:
        rel = os.path.relpath(path, root) if not os.path.relpath(path, root).startswith("..") else path
        src = Source(path, rel)
        found = check(src, root)
        if found and do_fix:
            fix(src, sorted({h for _, _, h in found}), root)
            src = Source(path, rel)
            found = check(src, root)
        for line, name, header in found:
            print("%s:%d: uses %s but does not include <%s>" % (rel, line, name, header))
            problems += 1
    if problems:
        print("check_includes.py: %d missing standard include(s) in %d file(s) checked" % (problems, len(files)),
              file=sys.stderr)
        return 1
    print("check_includes.py: %d files checked, every standard name's header included" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
