"""Drawing one example of the shapes dataset: a shape on a textured, noisy background.

Kept apart from `tfopt.data.generated`, which owns the dataset's files and their atomic writing: this
module only decides what an image looks like. Everything random comes from the generator passed in,
so an image is a pure function of its seed.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

DRAWABLE_SHAPES = ("circle", "square", "triangle", "cross", "ring")
# Shapes are drawn at twice the size and downsampled: cheap anti-aliasing, so edges look like a photo's
# rather than like aliased pixel art that a model could key on.
_SUPERSAMPLE = 2


def shape_id(shape: str) -> int:
    """A stable number per shape (not a list position), so `classes=("ring",)` draws the same rings."""
    return DRAWABLE_SHAPES.index(shape)


def draw_example(rng: np.random.Generator, shape: str, size: int) -> Image.Image:
    """Draws one `size` x `size` RGB image of `shape` (one of `DRAWABLE_SHAPES`) using `rng`."""
    background = _background(rng, size)
    big = size * _SUPERSAMPLE
    mask = Image.new("L", (big, big), 0)
    radius = rng.uniform(0.2, 0.36) * big
    margin = radius * 1.05
    centre = (rng.uniform(margin, big - margin), rng.uniform(margin, big - margin))
    angle = rng.uniform(0.0, 2.0 * math.pi)
    _DRAWERS[shape](ImageDraw.Draw(mask), centre, radius, angle)
    mask = mask.resize((size, size), Image.Resampling.LANCZOS)
    colour = _contrasting_colour(rng, np.asarray(background).reshape(-1, 3).mean(axis=0))
    foreground = Image.new("RGB", (size, size), tuple(int(c) for c in colour))
    image = Image.composite(foreground, background, mask)
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0.0, 4.0, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """A colour gradient with blurred noise and a few distractor strokes: texture, but no shape cue."""
    start, end = rng.uniform(40, 215, size=(2, 3))
    direction = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    ramp = (np.cos(direction) * xs + np.sin(direction) * ys + 1.0) / 2.0
    pixels = start + (end - start) * ramp[..., None]
    noise = rng.normal(0.0, 12.0, (size // 4 + 1, size // 4 + 1, 3))
    noise_image = Image.fromarray(np.clip(noise + 128, 0, 255).astype(np.uint8)).resize(
        (size, size), Image.Resampling.BICUBIC
    )
    pixels += np.asarray(noise_image, dtype=np.float32) - 128.0
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 3))):
        points = [tuple(rng.uniform(0, size, 2)) for _ in range(2)]
        shade = tuple(int(c) for c in rng.uniform(0, 255, 3))
        draw.line(points, fill=shade, width=1)
    return image.filter(ImageFilter.SMOOTH)


def _contrasting_colour(rng: np.random.Generator, background_mean: np.ndarray) -> np.ndarray:
    """Draws random colours until one differs enough from the background to be visible."""
    for _ in range(20):
        colour = rng.uniform(0, 255, 3)
        if np.abs(colour - background_mean).sum() > 180:
            return colour
    return 255.0 - background_mean


def _polygon(centre, radius, angle, unit_points):
    cos, sin = math.cos(angle), math.sin(angle)
    return [
        (centre[0] + radius * (x * cos - y * sin), centre[1] + radius * (x * sin + y * cos)) for x, y in unit_points
    ]


def _draw_circle(draw, centre, radius, angle):
    del angle  # a circle looks the same at every rotation
    x, y = centre
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=255)


def _draw_square(draw, centre, radius, angle):
    side = 0.8
    draw.polygon(
        _polygon(centre, radius, angle, [(-side, -side), (side, -side), (side, side), (-side, side)]), fill=255
    )


def _draw_triangle(draw, centre, radius, angle):
    corners = [(math.cos(a), math.sin(a)) for a in (0.0, 2 * math.pi / 3, 4 * math.pi / 3)]
    draw.polygon(_polygon(centre, radius, angle, corners), fill=255)


def _draw_cross(draw, centre, radius, angle):
    w = 0.3
    outline = [
        (-w, -1),
        (w, -1),
        (w, -w),
        (1, -w),
        (1, w),
        (w, w),
        (w, 1),
        (-w, 1),
        (-w, w),
        (-1, w),
        (-1, -w),
        (-w, -w),
    ]
    draw.polygon(_polygon(centre, radius, angle, outline), fill=255)


def _draw_ring(draw, centre, radius, angle):
    del angle
    x, y = centre
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=255)
    inner = radius * 0.55
    draw.ellipse((x - inner, y - inner, x + inner, y + inner), fill=0)


_DRAWERS = {
    "circle": _draw_circle,
    "square": _draw_square,
    "triangle": _draw_triangle,
    "cross": _draw_cross,
    "ring": _draw_ring,
}
