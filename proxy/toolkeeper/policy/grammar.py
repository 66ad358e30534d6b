"""What the command reader knows of tree-sitter-bash's grammar: how it reads each kind of node and token, and
which builtins evaluate their words as arithmetic (shell.py walks the tree with these tables)."""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Nodes whose words bash evaluates as arithmetic (besides `(( ))`, a compound_statement, and `let`)
ARITHMETIC_NODES = frozenset({"arithmetic_expansion", "c_style_for_statement", "test_command", "subscript"})

# Redirections that write to their target (`2>&1` is a duplication, not a file, when its target is a number).
WRITING = {">", ">>", ">|", "&>", "&>>", "<>", ">&"}
EXPANSIONS = {"simple_expansion", "expansion", "command_substitution", "process_substitution",
               "arithmetic_expansion"}
# Builtins that evaluate some arguments as arithmetic (or run a callback): `[[` and `declare` are nodes of their own.
ARITHMETIC = frozenset({"let", "test", "[", "read", "mapfile", "readarray", "printf", "export", "local",
                        "declare", "typeset", "readonly", "unset", "shift", "return", "exit"})


# How the walk reads each kind of named node tree-sitter-bash declares; a kind not here is not read, and the
# command is unresolved (tests/test_command_rules.py holds this table to the grammar's own list).
NODE_KINDS: dict[str, str] = {
    # statements: each child read in turn (the commands in them are reported)
    **dict.fromkeys(("program", "list", "pipeline", "subshell", "compound_statement", "if_statement",
                     "elif_clause", "else_clause", "while_statement", "for_statement", "c_style_for_statement",
                     "do_group", "case_statement", "case_item", "function_definition", "negated_command",
                     "redirected_statement", "variable_assignments"), "statement"),
    "command": "simple command", "command_name": "simple command",
    "variable_assignment": "assignment", "declaration_command": "assignment", "unset_command": "assignment",
    "test_command": "test",
    # redirections and their parts
    **dict.fromkeys(("file_redirect", "heredoc_redirect", "herestring_redirect", "heredoc_start",
                     "heredoc_body", "heredoc_content", "heredoc_end", "file_descriptor"), "redirection"),
    # words: read by literal(); what they cannot know is None (a value known only at run time)
    **dict.fromkeys(("word", "string", "raw_string", "ansi_c_string", "translated_string", "concatenation",
                     "string_content", "number", "simple_expansion", "expansion", "command_substitution",
                     "process_substitution", "arithmetic_expansion", "brace_expression", "array",
                     "extglob_pattern", "special_variable_name", "variable_name", "subscript", "regex"), "word"),
    # expressions of tests and arithmetic: their words read for the substitutions in them
    **dict.fromkeys(("binary_expression", "unary_expression", "ternary_expression", "postfix_expression",
                     "parenthesized_expression", "test_operator"), "expression"),
    "comment": "comment",
}
# The tokens bash's grammar writes as punctuation and keywords; each is read for what it is only when its text
# is itself (tree-sitter hands `-rf$` to a `$` token in `rm -rf$"" /x`: such a token is not read).
_PUNCTUATION = """! != " # ## $ $( $(( $[ $` ${ % %% %= & && &= &> &>> ( (( ) )) * ** **= *= + ++ += , ,, - -- -=
    -a -o .. / /# /% // /= : :+ :- := :? ; ;& ;; ;;& < <& <&- <( << <<- <<< <<= <= = == =~ > >& >&- >( >= >> >>= >|
    ? @ A E K L P Q U [ [[ ] ]] ^ ^= ^^ ` `` a case declare do done elif else esac export fi for function if in k
    local readonly select then typeset u unset unsetenv until while { | |& |= || } ~"""
TOKENS = frozenset(_PUNCTUATION.split())
