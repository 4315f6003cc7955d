"""Templated chat instructions across the kinds of request an assistant gets (no dataset download).

Magpie prompts from a 135M model are narrow and often garbled; these fill in the request kinds a
chat benchmark covers (writing, roleplay, reasoning, math, coding, extraction, STEM, humanities) by
composing task templates with topic lists and random numbers. They are written here, not taken from
any evaluation set; ``decontam`` still checks them against MT-bench/HumanEval like every prompt.
"""

from __future__ import annotations

import random

TOPICS = ("remote work", "urban gardening", "electric cars", "the history of tea", "learning a second language",
          "ocean plastic", "public libraries", "space tourism", "sleep and memory", "minimalism", "social media",
          "renewable energy", "the printing press", "volunteering", "video games in education", "street food",
          "climate adaptation", "honeybees", "open-source software", "marathon training", "jazz music",
          "artificial intelligence in medicine", "small businesses", "mountain hiking", "board games",
          "the Roman Empire", "coffee culture", "online privacy", "recycling", "photography", "public transport",
          "friendship", "chess", "bird migration", "budget travel", "home cooking", "the night sky", "robots",
          "ancient Egypt", "time management", "rainforests", "cybersecurity", "the Olympic Games", "desert life")
FORMS = ("a short story", "a poem", "a persuasive essay", "a blog post", "a formal email", "a product description",
         "a speech", "a limerick", "a haiku sequence", "a news article", "a diary entry", "a dialogue",
         "a cover letter", "a movie pitch", "a travel itinerary", "a LinkedIn post", "a song chorus")
AUDIENCES = ("a ten-year-old", "a high-school student", "a busy executive", "a first-year university student",
             "my grandmother", "a software engineer", "a complete beginner")
PERSONAS = ("a medieval knight", "a pirate captain", "a museum tour guide", "a detective in 1920s London",
            "a personal fitness coach", "a friendly librarian", "an astronaut on the Moon", "a famous chef",
            "a wise old wizard", "a sports commentator", "a customer support agent", "a career counselor",
            "a park ranger", "a stand-up comedian", "a travel agent", "a history teacher")
STEM = ("photosynthesis", "entropy", "black holes", "the immune system", "plate tectonics", "DNA replication",
        "quantum entanglement", "the greenhouse effect", "neural networks", "vaccines", "supply and demand",
        "the water cycle", "electric circuits", "evolution by natural selection", "the Doppler effect", "enzymes",
        "compound interest", "radioactive decay", "the speed of light", "blockchains", "antibiotic resistance",
        "gravity", "the periodic table", "sound waves", "volcanoes", "binary numbers", "the human heart")
HUMANITIES = ("the Renaissance", "the Industrial Revolution", "the French Revolution", "the Silk Road",
              "Greek philosophy", "the invention of writing", "impressionist painting", "the Cold War",
              "Shakespeare's tragedies", "the abolition of slavery", "the Meiji Restoration", "the printing press",
              "the civil rights movement", "the fall of Constantinople", "existentialism", "the Harlem Renaissance")
CODE_TASKS = ("reverses a linked list", "checks whether a string is a palindrome", "merges two sorted lists",
              "counts word frequencies in a text", "finds the longest common prefix of a list of strings",
              "computes the nth Fibonacci number iteratively", "flattens a nested list", "validates an email address",
              "implements binary search", "removes duplicates from a list while keeping order",
              "parses a CSV line into fields", "computes the greatest common divisor", "rotates a matrix by 90 degrees",
              "checks whether parentheses are balanced", "converts a Roman numeral to an integer",
              "finds all prime numbers below n", "groups anagrams together", "implements a LRU cache",
              "computes the edit distance between two strings", "transposes a matrix", "serializes a binary tree")
LANGS = ("Python", "JavaScript", "C++", "Java", "Go", "Rust", "SQL", "Bash")
NAMES = ("Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Keiko", "Liam")
ITEMS = ("apples", "books", "marbles", "pencils", "stickers", "cookies", "coins", "tickets")


def _math(r: random.Random) -> str:
    a, b, c = r.randint(2, 30), r.randint(2, 60), r.randint(61, 400)
    n1, n2 = r.sample(NAMES, 2)
    return r.choice((
        f"Solve for x: {a}x + {b} = {c}. Show your steps.",
        f"{n1} has {c} {r.choice(ITEMS)} and gives {b} to {n2}, then buys {a} more. How many does {n1} have now?",
        f"What is the area of a rectangle that is {a} cm wide and {b} cm long? Explain.",
        f"A train travels {c} km in {a} hours. What is its average speed? Then how long would {c + b} km take?",
        f"Find the sum of all integers from 1 to {c}.",
        f"What is {a}% of {c}? Explain how to compute it mentally.",
        f"A shop sells a jacket for ${c}. It is discounted by {a}% and then taxed at {b % 15 + 5}%. What is the final price?",
        f"If f(x) = {a}x^2 - {b}x + {c % 50}, what is f({r.randint(1, 9)})?",
        f"The vertices of a triangle are at (0, 0), ({a}, 0) and (0, {b}). What is its area and perimeter?",
        f"How many ways can {r.randint(3, 8)} people sit in a row of chairs? Explain the reasoning."))


def _reasoning(r: random.Random) -> str:
    n1, n2, n3 = r.sample(NAMES, 3)
    k = r.randint(3, 9)
    return r.choice((
        f"{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest? Explain your reasoning.",
        f"If it takes {k} machines {k} minutes to make {k} widgets, how long would {k * 10} machines take to make "
        f"{k * 10} widgets?",
        f"{n1} is {n2}'s mother and {n3} is {n1}'s father. How is {n3} related to {n2}?",
        f"I have {k} shirts and {k + 2} pairs of trousers. How many different outfits can I make? Think step by step.",
        f"A bat and a ball cost ${k}.10 in total. The bat costs ${k} more than the ball. How much does the ball cost?",
        f"Three friends, {n1}, {n2} and {n3}, each own a different pet: a cat, a dog and a fish. {n1} is allergic "
        f"to fur and {n2} walks their pet every day. Who owns which pet?",
        f"Is the following argument valid? All {r.choice(ITEMS)} in the box are red. This one is red, so it is in "
        f"the box. Explain."))


def instruction(r: random.Random) -> str:
    t, f, a, p = r.choice(TOPICS), r.choice(FORMS), r.choice(AUDIENCES), r.choice(PERSONAS)
    s, h, c, lang = r.choice(STEM), r.choice(HUMANITIES), r.choice(CODE_TASKS), r.choice(LANGS)
    kind = r.randrange(8)
    if kind == 0:
        return r.choice((f"Write {f} about {t}.", f"Compose {f} about {t} in under 200 words.",
                         f"Draft {f} about {t} for {a}.", f"Write {f} that makes {t} sound exciting."))
    if kind == 1:
        return r.choice((f"Pretend you are {p}. Tell me about {t}.", f"Act as {p} and give me advice on {t}.",
                         f"You are {p}. Describe your typical day.", f"Roleplay as {p} and explain {s} to {a}."))
    if kind == 2:
        return _reasoning(r)
    if kind == 3:
        return _math(r)
    if kind == 4:
        return r.choice((f"Write a {lang} function that {c}.", f"Explain what a function that {c} does, then write "
                         f"it in {lang}.", f"What is the time complexity of a function that {c}? Give code in {lang}.",
                         f"Find the bug: I wrote {lang} code that {c} but it fails on empty input. How should I fix "
                         "it?"))
    if kind == 5:
        return r.choice((f"List five key facts about {t} as bullet points.", f"Summarize the main arguments for and "
                         f"against {t} in a table.", f"Give me a JSON object with three pros and three cons of {t}.",
                         f"Extract the main ideas of this sentence and list them: '{t.capitalize()} changed how "
                         f"people think about {r.choice(TOPICS)}.'"))
    if kind == 6:
        return r.choice((f"Explain {s} to {a}.", f"What is {s}, and why does it matter?",
                         f"Describe {s} step by step.", f"What are common misconceptions about {s}?"))
    return r.choice((f"What were the causes and effects of {h}?", f"Explain the significance of {h} for {a}.",
                     f"Compare {h} with {r.choice(HUMANITIES)}.", f"How did {h} influence modern {t}?"))


def instructions(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct templated instructions (fewer only if the templates run out of combinations)."""
    r, out, seen = random.Random(seed), [], set()
    for _ in range(50 * n):
        text = instruction(r)
        if text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) == n:
                break
    return out
