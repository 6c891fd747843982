"""More self-distillation prompts: templated requests in the built-in suite's categories.

The first self-distillation data (`selfgen.build_prompts`: explain / qa / summarise / function /
module) is all about Python documentation, but a drafter meets everyday chat, general-knowledge
questions, word problems and "here is a function, change it" requests too (the built-in suite's
chat / qa / math / code_edit categories). These builders make such prompts offline, from word
lists written here and from standard-library source, so the target's own answers to them can be
generated (`python -m specdraft.train.selfgen --kinds ...`).

None of them is a built-in suite prompt: `exclude_suite` drops any prompt whose user text, or whose
quoted code, also occurs in `specdraft/suites/builtin.jsonl` (tested), and the word lists leave out
the suite's own subjects (France, Romeo and Juliet, HTTP, `len`, cooking, ...).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterable

from specdraft.train.selfgen import Prompt, parsed_modules, stdlib_files

# ------------------------------------------------------------------------------------ word lists
COUNTRIES = (
    "Germany", "Italy", "Spain", "Portugal", "Japan", "Canada", "Australia", "Brazil", "Egypt",
    "Kenya", "India", "China", "Mexico", "Argentina", "Norway", "Sweden", "Finland", "Poland",
    "Greece", "Turkey", "Ireland", "Austria", "Switzerland", "the Netherlands", "Belgium", "Chile",
    "Peru", "Thailand", "Vietnam", "South Korea", "Nigeria", "Morocco", "Denmark", "Hungary",
    "Czechia", "New Zealand", "Colombia", "Indonesia", "the Philippines", "Iceland",
)
WORKS = (
    "Hamlet", "Pride and Prejudice", "War and Peace", "Don Quixote", "The Odyssey", "Moby-Dick",
    "Great Expectations", "Jane Eyre", "The Divine Comedy", "Faust", "Crime and Punishment",
    "Nineteen Eighty-Four", "The Great Gatsby", "Frankenstein", "Dracula", "Macbeth", "Othello",
    "Les Miserables", "The Old Man and the Sea", "To Kill a Mockingbird", "Anna Karenina",
    "The Little Prince", "Ulysses", "Wuthering Heights", "The Canterbury Tales", "Oliver Twist",
    "A Doll's House", "The Raven", "Brave New World", "The Hobbit",
)
ACRONYMS = (
    "CPU", "GPU", "RAM", "URL", "HTML", "CSS", "JSON", "SQL", "API", "DNS", "TCP", "UDP", "USB",
    "PDF", "NASA", "UNESCO", "DNA", "ATM", "GPS", "LED", "SSH", "FTP", "IP", "ISP", "Wi-Fi", "CEO",
    "FAQ", "ASCII", "UTF", "RSS", "XML", "YAML", "REST", "IDE", "OS", "SSD",
)
WHYS = (
    "Why do leaves change colour in autumn?", "Why is the sea salty?", "Why do we have seasons?",
    "Why does ice float on water?", "Why do cats purr?", "Why is the sunset red?",
    "Why do we need sleep?", "Why does bread rise?", "Why do stars twinkle?",
    "Why does the moon have phases?", "Why is exercise good for the heart?",
    "Why do onions make people cry?", "Why do birds migrate?", "Why does metal feel cold?",
    "Why do we get hiccups?", "Why is the grass green?", "Why does a compass point north?",
    "Why do airplanes fly?", "Why is recycling useful?", "Why do bees make honey?",
    "Why does popcorn pop?", "Why do we yawn?", "Why is the Dead Sea so salty?",
    "Why do volcanoes erupt?", "Why does a rainbow appear after rain?",
)
BUILTINS = (
    "abs", "all", "any", "bin", "bool", "chr", "dict", "dir", "divmod", "enumerate", "filter",
    "float", "format", "hash", "hex", "id", "input", "int", "isinstance", "iter", "list", "map",
    "max", "min", "next", "oct", "open", "ord", "pow", "print", "range", "repr", "reversed",
    "round", "set", "sorted", "str", "sum", "tuple", "type", "zip",
)
PY_PAIRS = (
    ("a set", "a list"), ("a dictionary", "a list"), ("`==`", "`is`"), ("a function", "a method"),
    ("`append`", "`extend`"), ("`break`", "`continue`"), ("a module", "a package"),
    ("`str`", "`bytes`"), ("`sort()`", "`sorted()`"), ("a shallow copy", "a deep copy"),
    ("`range`", "a list"), ("an iterator", "an iterable"), ("`return`", "`yield`"),
    ("`*args`", "`**kwargs`"), ("a class", "an instance"), ("`try`/`except`", "`if`/`else`"),
    ("a local variable", "a global variable"), ("`import x`", "`from x import y`"),
    ("`/`", "`//`"), ("`del`", "`remove()`"),
)
SKILLS = (
    "play the guitar", "paint with watercolours", "speak Spanish", "swim", "program in Python",
    "bake bread", "draw portraits", "play chess", "knit", "take better photos", "garden",
    "dance salsa", "play the piano", "write poetry", "meditate", "ride a bicycle", "juggle",
    "sing", "invest money", "touch type",
)
FOLLOWUPS_BY_SKILL = (
    "How much time should I practise each day?", "What mistakes do beginners make most often?",
    "What equipment do I need, and how much does it cost?", "How do I stay motivated?",
    "How long does it take to get good at it?",
)
EMAILS = (
    ("my landlord", "the kitchen tap is leaking"), ("my manager", "I will be late tomorrow"),
    ("a customer", "their order has shipped"), ("my neighbour", "there will be a party on Saturday"),
    ("my team", "the project deadline moved to next Monday"), ("a teacher", "my son is ill today"),
    ("the library", "I need to renew a book"), ("a colleague", "thank you for the help last week"),
    ("my doctor", "I need to reschedule my appointment"), ("the hotel", "we will arrive late at night"),
    ("a friend", "I cannot come to dinner on Friday"), ("my team", "the office is closed on Monday"),
    ("a supplier", "the last delivery was missing two boxes"), ("my class", "the exam is next week"),
)
TRIPS = (
    "a beach holiday in summer", "a ski trip", "a business trip to London", "a camping weekend",
    "a week in a big city", "a long train journey", "a hiking trip in the rain",
    "a visit to my grandparents", "a music festival", "a winter holiday in Finland",
)
GOALS = (
    "saving money", "sleeping better", "eating more healthily", "studying for exams",
    "working from home", "keeping a plant alive", "learning new words", "staying focused",
    "writing a CV", "preparing for a job interview", "reducing stress", "keeping my room tidy",
    "drinking more water", "starting to jog", "reading more books", "making new friends",
)
CODE_TASKS = (
    ("reverse_words(text)", "returns the words of a sentence in reverse order"),
    ("is_prime(n)", "returns True if n is a prime number"),
    ("factorial(n)", "returns n! and raises ValueError for negative n"),
    ("fibonacci(n)", "returns a list of the first n Fibonacci numbers"),
    ("count_vowels(text)", "returns how many vowels the text contains"),
    ("unique(items)", "returns the items without duplicates, keeping their first order"),
    ("chunk(items, size)", "splits a list into lists of at most size items"),
    ("average(numbers)", "returns the mean of a list of numbers, or None for an empty list"),
    ("capitalize_words(text)", "capitalises the first letter of every word"),
    ("merge_dicts(a, b)", "returns a new dictionary with the keys of both, b winning on conflicts"),
    ("second_largest(numbers)", "returns the second largest distinct number"),
    ("gcd(a, b)", "returns the greatest common divisor of two integers"),
    ("to_binary(n)", "returns the binary representation of a non-negative integer as a string"),
    ("word_lengths(text)", "returns a dictionary from each word to its length"),
    ("transpose(matrix)", "transposes a list of lists"),
    ("read_lines(path)", "returns the non-empty lines of a text file without trailing newlines"),
    ("is_anagram(a, b)", "returns True if the two strings are anagrams of each other"),
    ("running_total(numbers)", "returns the list of running sums"),
    ("clamp(x, low, high)", "limits x to the range from low to high"),
    ("longest_word(text)", "returns the longest word in the text"),
    ("Counter", "class with methods increment(), decrement() and reset(), starting at zero"),
    ("Queue", "class with the methods enqueue(item), dequeue() and size()"),
    ("BankAccount", "class with deposit(amount), withdraw(amount) and a balance property"),
    ("Rectangle", "class with width, height and the methods area() and perimeter()"),
)
CODE_INSTRUCTIONS = (
    "Add type hints to this function. Return the complete updated function.",
    "Add a docstring that explains the parameters and the return value. Return the full function.",
    "Explain what this function does in three sentences.",
    "Rewrite this function so that it is easier to read, without changing what it does.",
    "Write two pytest tests for this function.",
    "Add comments to the important lines of this function. Return the complete function.",
    "Rename the local variables to clearer names. Return the complete updated function.",
    "What does this function return for an empty input? Explain briefly.",
)
DOC_QUESTIONS = (
    "List the main points of this passage as short bullet points.",
    "Quote the first code example of this passage, then explain it in one sentence.",
    "What is the most important rule this passage states? Answer in two sentences.",
    "Explain this passage to a beginner in three sentences.",
)
# Multi-turn "revise" chats: a user request, a short human-style assistant answer written here (not
# the target's), then a request to change that answer, as in the suite's chat category.
LISTS = (
    ("to-do list", ("call the bank", "water the plants", "pay the rent", "book a haircut", "clean the bathroom",
                    "reply to Tom", "buy stamps", "fix the bike light", "return the library books")),
    ("reading list", ("Dune", "Emma", "Beloved", "Middlemarch", "Walden", "The Hobbit", "Kindred", "Persuasion")),
    ("guest list", ("Maria", "Jonas", "Priya", "Lucas", "Sofia", "Omar", "Hannah", "Kenji", "Elena")),
    ("list of chores", ("vacuum the stairs", "take out the trash", "wash the dishes", "iron the shirts",
                        "feed the cat", "mow the lawn", "dust the shelves")),
    ("playlist", ("Yesterday", "Imagine", "Hallelujah", "Halo", "Africa", "Respect", "Wonderwall", "Jolene")),
    ("list of errands", ("pick up the dry cleaning", "post the parcel", "refill the prescription",
                         "get the car washed", "drop off the recycling", "collect the keys")),
    ("packing list", ("passport", "charger", "toothbrush", "sunglasses", "socks", "a rain jacket", "a towel")),
    ("list of gift ideas", ("a scarf", "a board game", "a cookbook", "concert tickets", "a plant", "a mug")),
)
LIST_EDITS = (
    "Please add {x} and {y}, then show me the full list again.",
    "Remove {a} and add {x}. Show the updated list.",
    "Sort the list alphabetically.",
    "Can you turn it into bullet points instead of numbers?",
    "Add {x} at the top and give me the complete list.",
    "Which item should I do first? Then show the list again with that item first.",
)
CODE_SNIPPETS = (
    ("keep only the even numbers from a list", "evens = []\nfor n in numbers:\n    if n % 2 == 0:\n        evens.append(n)\nprint(evens)"),
    ("turn every word in a list into upper case", "upper = []\nfor word in words:\n    upper.append(word.upper())\nprint(upper)"),
    ("get the length of every name in a list", "lengths = []\nfor name in names:\n    lengths.append(len(name))\nprint(lengths)"),
    ("add up the prices in a list", "total = 0\nfor price in prices:\n    total = total + price\nprint(total)"),
    ("build a dictionary from two lists of keys and values", "result = {}\nfor i in range(len(keys)):\n    result[keys[i]] = values[i]\nprint(result)"),
    ("count how often each letter appears in a word", "counts = {}\nfor ch in word:\n    if ch in counts:\n        counts[ch] += 1\n    else:\n        counts[ch] = 1\nprint(counts)"),
    ("find the largest number in a list", "largest = numbers[0]\nfor n in numbers:\n    if n > largest:\n        largest = n\nprint(largest)"),
    ("read a file and print its lines", "f = open('notes.txt')\nfor line in f:\n    print(line.strip())\nf.close()"),
    ("join a list of words with commas", "text = ''\nfor i, word in enumerate(words):\n    if i > 0:\n        text += ', '\n    text += word\nprint(text)"),
    ("remove the empty strings from a list", "cleaned = []\nfor s in items:\n    if s != '':\n        cleaned.append(s)\nprint(cleaned)"),
    ("print the numbers from 10 down to 1", "n = 10\nwhile n > 0:\n    print(n)\n    n = n - 1"),
    ("check if a string is a palindrome", "is_palindrome = True\nfor i in range(len(s) // 2):\n    if s[i] != s[len(s) - 1 - i]:\n        is_palindrome = False\nprint(is_palindrome)"),
)
CODE_EDITS = (
    "Please rewrite it using a list comprehension or a built-in function.",
    "Put that code into a function with a docstring.",
    "Add a comment to each line.",
    "Add type hints and wrap it in a function.",
    "How would I test this code? Write one pytest test.",
    "Make it shorter.",
)
EMAIL_DRAFTS = (
    "Subject: {topic}\n\nHi,\n\nJust a quick note: {what}. Let me know if you have any questions.\n\nBest,",
    "Subject: {topic}\n\nHello,\n\nI wanted to let you know that {what}. Thank you for understanding.\n\nKind regards",
)
EMAIL_EDITS = (
    "Make it more polite and sign it with my name, {name}.",
    "Make it shorter and friendlier.",
    "Add a sentence asking for a reply by Wednesday.",
    "Please make it sound more formal. My name is {name}.",
    "Rewrite it as a short text message instead.",
)
ADVICE_TURNS = (
    ("I want to grow tomatoes on my balcony. How do I start?",
     "Buy a large pot with drainage holes, good potting soil and a young tomato plant. Put it in the sunniest spot and water it every morning."),
    ("How can I get better at public speaking?",
     "Practise your talk out loud several times, record yourself, and start with small groups of friends before larger audiences."),
    ("I keep forgetting people's names. Any advice?",
     "Repeat the name when you are introduced, use it once or twice in the conversation, and link it to something you notice about the person."),
    ("What should I do to prepare for a long flight?",
     "Wear comfortable clothes, bring a neck pillow and headphones, drink plenty of water and stand up to stretch every couple of hours."),
    ("How do I clean a cast iron pan?",
     "Rinse it with hot water while it is still warm, scrub it with a brush, dry it completely and rub in a thin layer of oil."),
    ("My houseplant has yellow leaves. What is wrong?",
     "Yellow leaves usually mean too much water. Let the soil dry out between waterings and make sure the pot drains well."),
    ("How can I save money on groceries?",
     "Plan your meals for the week, write a list before you go, buy store brands and avoid shopping when you are hungry."),
    ("What is a good morning routine?",
     "Wake up at the same time every day, drink a glass of water, move for ten minutes and plan your three most important tasks."),
    ("How do I start learning to draw?",
     "Get a pencil and a sketchbook, draw simple objects around you every day, and learn basic shapes, light and shadow."),
    ("How can I make my small flat feel bigger?",
     "Use light colours on the walls, add a large mirror, keep the floor clear and choose furniture with legs so you can see under it."),
    ("What should I bring to a job interview?",
     "Bring two copies of your CV, a notebook and pen, a list of questions for the interviewer and the address and contact name."),
    ("How do I train my dog to sit?",
     "Hold a treat above its nose, move it slowly back over its head, and say 'sit' as it lowers itself. Reward it right away."),
)
ADVICE_EDITS = (
    "Thanks. Can you put that into a numbered list of steps?",
    "That sounds hard. What is the single most important thing?",
    "Can you explain that in more detail?",
    "I only have ten minutes a day. What should I change?",
    "Can you give me all of that as a checklist with bullet points?",
)
SECOND_REVISIONS = {  # a third user turn after the target's own revised answer ("followup" of "revise")
    "list": ("Thanks. Now remove the last item and show the list again.",
             "Can you group the items into two categories?", "Show the list in reverse order.",
             "Please add a short note next to each item."),
    "code": ("Can you explain how the new version works?", "Now add error handling for an empty input.",
             "Show me how to call it with an example.", "Thanks. Can you make the variable names clearer?"),
    "email": ("Thanks. Now make it a bit shorter.", "Can you add a line thanking them for their patience?",
              "Now write a short reply to this email.", "Can you suggest a better subject line?"),
    "advice": ("Thanks. What should I avoid?", "Can you summarise that in one sentence?",
               "How long will it take to see results?", "Can you make it into a weekly plan?"),
}
NAMES = ("Lena Fischer", "Tom Baker", "Aisha Khan", "Marco Rossi", "Yuki Tanaka", "Sara Lind")
KINDS = ("general_qa", "advice", "email", "math", "code_edit", "code_write", "docread", "revise")
MATH_SUFFIXES = (
    "Think step by step.", "Show your reasoning.", "Explain each step.", "Solve it step by step.",
    "Show each step.", "Reason step by step.",
)


# ------------------------------------------------------------------------------------ builders
def _math(rng: random.Random) -> str:
    """One word problem with fresh numbers (the target's answer need not be right: it is data)."""
    a, b, c = rng.randint(2, 9), rng.randint(10, 60), rng.randint(2, 12)
    items = rng.choice(("books", "oranges", "tickets", "cookies", "marbles", "stickers"))
    name = rng.choice(("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo"))
    templates = (
        f"{name} has {b} {items}. {name} buys {c} more and then gives away {a}. How many {items} are left?",
        f"A car uses {a} litres of fuel per 100 km. How much fuel does it need for {b * 10} km?",
        f"A box holds {c} {items}. How many boxes are needed for {b * c + a} {items}?",
        f"A cinema ticket costs ${a}.50. How much do {c} tickets cost?",
        f"A bike rides at {b // 2 + 5} km per hour for {c} hours. How far does it go?",
        f"The price of a coat is ${b * 5}. It is reduced by {rng.choice((10, 20, 25, 50))}%. What is the new price?",
        f"A square has a side of {c} cm. What are its perimeter and its area?",
        f"{name} reads {a * 5} pages a day. How many days does a book of {a * 5 * c} pages take?",
        f"The average of three numbers is {b}. Two of them are {b - a} and {b + c}. What is the third?",
        f"A water tank holds {b * 10} litres and is {rng.choice((25, 50, 75))}% full. How many litres does it hold?",
        f"There are {b} students and {a} teachers on a trip. Each bus takes {c + 10} people. How many buses are needed?",
        f"A recipe needs {a} eggs for {c} people. How many eggs are needed for {c * 3} people?",
    )
    return f"{rng.choice(templates)} {rng.choice(MATH_SUFFIXES)}"


def _revise_prompts(seed: int) -> list[Prompt]:
    """Multi-turn chats whose assistant turn is written here and whose last turn asks to change it.
    Their own random stream (seed + 1), so adding them left the other kinds' prompts as generated."""
    rng = random.Random(seed + 1)
    out = []
    for name, items in LISTS:
        for j, edit in enumerate(LIST_EDITS):
            picked = rng.sample(items, 4)
            rest = [i for i in items if i not in picked]
            listed = "\n".join(f"{k + 1}. {i[0].upper() + i[1:]}" for k, i in enumerate(picked))
            history = (("user", f"Here is my {name}: {', '.join(picked)}."),
                       ("assistant", f"Got it. Your {name} is:\n{listed}"))
            ask = edit.format(x=rest[0], y=rest[1], a=picked[1])
            out.append(Prompt(f"revise/list/{name}/{j}", "revise", ask, history=history))
    for task, code in CODE_SNIPPETS:
        for j, edit in enumerate(CODE_EDITS):
            history = (("user", f"How do I {task} in Python?"),
                       ("assistant", f"You can use a loop:\n\n```python\n{code}\n```"))
            out.append(Prompt(f"revise/code/{task}/{j}", "revise", edit, history=history))
    for who, what in EMAILS:
        for j, edit in enumerate(EMAIL_EDITS):
            topic = what[0].upper() + what[1:]
            draft = rng.choice(EMAIL_DRAFTS).format(topic=topic, what=what)
            history = (("user", f"Please write a short email to {who} saying {what}."), ("assistant", draft))
            out.append(Prompt(f"revise/email/{who}/{what}/{j}", "revise",
                              edit.format(name=rng.choice(NAMES)), history=history))
    for i, (question, answer) in enumerate(ADVICE_TURNS):
        for j, edit in enumerate(ADVICE_EDITS):
            out.append(Prompt(f"revise/advice/{i}/{j}", "revise", edit,
                              history=(("user", question), ("assistant", answer))))
    return out


def _short_stdlib_functions(max_lines: int = 24, max_files: int = 200) -> Iterable[tuple[str, str]]:
    """(qualified name, source) of short top-level stdlib functions that have a body worth editing."""
    files = [p for p in stdlib_files()[:max_files] if not p.name.startswith("_")]
    for path, text, tree in parsed_modules(files):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                src = ast.get_source_segment(text, node)
                if src and 5 <= src.count("\n") + 1 <= max_lines:
                    yield f"{path.stem}.{node.name}", src


def build_extra_prompts(seed: int = 0, max_code_edit: int = 200) -> list[Prompt]:
    """All templated prompts of the kinds general_qa, advice, email, math, code_edit, code_write,
    docread and revise, in a deterministic order."""
    from pydoc_data.topics import topics

    rng = random.Random(seed)
    out: list[Prompt] = []
    out += [Prompt(f"gqa/capital/{c}", "general_qa", f"What is the capital of {c}?") for c in COUNTRIES]
    out += [Prompt(f"gqa/author/{w}", "general_qa", f"Who wrote {w}?") for w in WORKS]
    out += [Prompt(f"gqa/acronym/{a}", "general_qa", f"What does {a} stand for?") for a in ACRONYMS]
    out += [Prompt(f"gqa/why/{i}", "general_qa", f"{q} Answer in two sentences.") for i, q in enumerate(WHYS)]
    out += [
        Prompt(f"gqa/builtin/{f}", "general_qa", f"What does the Python built-in function `{f}` return?")
        for f in BUILTINS
    ]
    out += [
        Prompt(f"gqa/pydiff/{a}|{b}", "general_qa", f"What is the difference between {a} and {b} in Python?")
        for a, b in PY_PAIRS
    ]
    out += [Prompt(f"advice/learn/{s}", "advice", f"I want to learn to {s}. Where should I start?") for s in SKILLS]
    out += [Prompt(f"advice/tips/{g}", "advice", f"Give me three practical tips for {g}.") for g in GOALS]
    out += [Prompt(f"advice/pack/{t}", "advice", f"I am planning {t}. What should I pack?") for t in TRIPS]
    out += [
        Prompt(f"email/{w}/{s}", "email", f"Can you write a short email to {w} saying {s}?") for w, s in EMAILS
    ]
    out += [Prompt(f"math/{i}", "math", _math(rng)) for i in range(240)]
    out += [
        Prompt(f"code_write/{sig}", "code_write", f"Write a Python {'class' if 'class' in what else 'function'} "
               f"`{sig}` {'' if 'class' in what else 'that '}{what.replace('class with', 'with')}.")
        for sig, what in CODE_TASKS
    ]
    functions = list(_short_stdlib_functions())
    for name, src in sorted(rng.sample(functions, min(max_code_edit, len(functions)))):
        instr = rng.choice(CODE_INSTRUCTIONS)
        out.append(
            Prompt(f"code_edit/{name}", "code_edit", f"Here is a Python function:\n\n```python\n{src}\n```\n\n{instr}")
        )
    for key in sorted(topics):
        body = topics[key].strip()
        if 200 < len(body) < 4000:
            q = rng.choice(DOC_QUESTIONS)
            out.append(
                Prompt(f"docread/{key}", "docread",
                       f"Read this passage from the Python documentation:\n\n{body[:1500]}\n\n{q}")
            )
    out += _revise_prompts(seed)
    return out


def followup_prompts(records: Iterable[dict], seed: int = 0) -> list[Prompt]:
    """Next turns in the same chat, after the target's own answer (as in the suite's multi-turn
    chats): one follow-up question for every generated `advice` answer, and one more change for
    every generated `revise` answer (whose earlier turns are rebuilt from its id)."""
    rng = random.Random(seed)
    revise = {p.id: p for p in _revise_prompts(seed)}
    out = []
    for r in records:
        if not r.get("completion"):
            continue
        if r.get("kind") == "advice":
            history = (("user", r["prompt"]), ("assistant", r["completion"].strip()))
            q = rng.choice(FOLLOWUPS_BY_SKILL)
        elif r.get("kind") == "revise" and r["id"] in revise:
            first = revise[r["id"]]
            history = first.history + (("user", first.text), ("assistant", r["completion"].strip()))
            q = rng.choice(SECOND_REVISIONS[r["id"].split("/")[1]])
        else:
            continue
        out.append(Prompt(f"followup/{r['id']}", "followup", q, history=history))
    return out


def exclude_suite(prompts: Iterable[Prompt], suite_texts: Iterable[str]) -> list[Prompt]:
    """Drop prompts whose user text equals a suite message, or whose quoted code a suite message
    contains (the suite's code_edit functions come from the standard library too)."""
    texts = list(suite_texts)
    exact = set(texts)
    joined = "\n".join(texts)

    def clash(p: Prompt) -> bool:
        if p.text in exact or any(c in exact for r, c in p.history if r == "user"):
            return True
        if "```python\n" in p.text:
            code = p.text.split("```python\n", 1)[1].split("```", 1)[0]
            first = code.splitlines()[0] if code else ""
            return first != "" and first in joined
        if p.kind == "docread":
            passage = p.text.split("\n\n", 1)[1][:300]
            return passage in joined
        return False

    return [p for p in prompts if not clash(p)]


def suite_user_texts(name: str = "builtin") -> list[str]:
    """Every user message of a suite (what the selfgen data must not contain)."""
    from specdraft.suites import load_suite

    return [m.content for sp in load_suite(name) for m in sp.messages if m.role == "user"]


def extra_prompts_for(kinds: Iterable[str], seed: int = 0,
                      suite: Callable[[], list[str]] = suite_user_texts) -> list[Prompt]:
    """The templated prompts of the given kinds, minus anything in the built-in suite."""
    wanted = set(kinds)
    unknown = wanted - set(KINDS) - {"followup"}
    if unknown:
        raise ValueError(
            f"unknown selfgen kinds {sorted(unknown)}; choose from {list(KINDS) + ['followup']} "
            "(followup: next turns after the generated advice and revise answers)."
        )
    return exclude_suite([p for p in build_extra_prompts(seed) if p.kind in wanted], suite())
