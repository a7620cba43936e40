"""Files in MovieLens-1M's exact byte format, small: ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``),
``movies.dat`` (``MovieID::Title::Genres``, Latin-1 titles holding ``:``, commas, parentheses and quotes) and
``users.dat`` (``UserID::Gender::Age::Occupation::Zip-code``), ``::``-separated, no header, LF line ends. Ratings
are sorted by user, their times in 2000-2003 with most in 2000, as the real file's."""

from __future__ import annotations

import random
from pathlib import Path

TITLES = [
    "Toy Story (1995)",
    "Jumanji (1995)",
    "Grumpier Old Men (1995)",
    "Crimson Pirate, The (1952)",
    "Star Wars: Episode IV - A New Hope (1977)",
    "Misérables, Les (1995)",
    "Robocop 2 (1990)",
    "City of Lost Children, The (Cité des enfants perdus, La) (1995)",
    '"Great Performances" Cats (1998)',
    "Wallace & Gromit: The Best of Aardman Animation (1996)",
    "Postino, Il (1994)",
    "Être et avoir (2002)",
]
GENRES = [
    "Animation|Children's|Comedy",
    "Adventure|Children's|Fantasy",
    "Comedy|Romance",
    "Action|Adventure|Comedy|Sci-Fi",
    "Action|Adventure|Fantasy|Sci-Fi",
    "Drama|Musical",
    "Action|Crime|Sci-Fi",
    "Adventure|Sci-Fi",
    "Musical",
    "Animation",
    "Drama|Romance",
    "Documentary",
]
NUM_MOVIES = 60
VALID_FROM = 975628800  # 2000-12-01, the MovieLens-1M presets' split
START, LATE, END = 956703932, 970000000, 1046454590  # 2000-04-25, 2000-09-26, 2003-02-28


def movie_genres(movie: int) -> str:
    return GENRES[(movie - 1) % len(GENRES)]


def write_movielens_1m(folder: Path, num_users: int = 24, per_user: int = 16, seed: int = 0) -> Path:
    """The three files in ``folder`` (made if need be), which is returned; a user's ratings follow one genre more
    than the others (a rating >= 4 for a movie of the user's genre), so that a model has something to learn."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    movies = [f"{m}::{TITLES[(m - 1) % len(TITLES)]}::{movie_genres(m)}" for m in range(1, NUM_MOVIES + 1)]
    (folder / "movies.dat").write_bytes(("\n".join(movies) + "\n").encode("latin-1"))
    ratings, users = [], []
    for user in range(1, num_users + 1):
        liked = user % len(GENRES)
        # Every fourth user rates into 2001-2003 too, the others in 2000 only: both splits hold rows.
        last = END if user % 4 == 0 else VALID_FROM - 1
        times = sorted(rng.randint(START, last) for _ in range(per_user))
        if user % 4 == 0:
            times[-3:] = sorted(rng.randint(VALID_FROM, END) for _ in range(3))
        for movie, time in zip(rng.sample(range(1, NUM_MOVIES + 1), per_user), times):
            liked_movie = (movie - 1) % len(GENRES) == liked or rng.random() < 0.3
            rating = rng.randint(4, 5) if liked_movie else rng.randint(1, 3)
            ratings.append(f"{user}::{movie}::{rating}::{time}")
        users.append(f"{user}::{'MF'[user % 2]}::{(18, 25, 35)[user % 3]}::{user % 21}::{55000 + user:05d}")
    (folder / "ratings.dat").write_bytes(("\n".join(ratings) + "\n").encode("latin-1"))
    (folder / "users.dat").write_bytes(("\n".join(users) + "\n").encode("latin-1"))
    return folder
