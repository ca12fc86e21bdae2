"""A GenEval-style scorer for the captioned-shapes world: does an image show what its prompt says?

The scorer reads the prompt with :func:`~diffusers_var_accel.lab.data.shapes.parse_prompt` and looks at the pixels only
(never at a scene's metadata), so it judges generated images exactly as it judges rendered ground truth.

Detection (:func:`detect_objects`)
----------------------------------
1. **Background.** The densest colours of the image's border frame (``side / 32`` px wide), each covering at least
   15 % of it, are background colours; pixels within RGB distance 40 of one are background. The world's backgrounds
   are neutral greys, which step 2 rejects anyway; this step also removes tinted backgrounds of generated images.
2. **Colour.** A pixel is *chromatic* when its chroma ``max(r, g, b) - min(r, g, b)`` is at least 40; it takes the
   palette colour nearest in hue (neighbouring palette hues are 26-92 degrees apart, see
   :data:`~diffusers_var_accel.lab.data.shapes.PALETTE`) if that hue is within 30 degrees, else it stays unassigned.
   The palette is the prompt's grammar's: the original six colours, or with pink and cyan for a prompt that uses a
   word of the enlarged grammar (:func:`~diffusers_var_accel.lab.data.shapes.grammar_of`; hues 26-53 degrees apart).
   Hue, not RGB distance, is compared because mixing a colour with any grey (antialiased or blurred edges, shading,
   a darker or lighter rendition) keeps its hue and only lowers its chroma.
3. **Components.** Pixels of the same colour are grouped into 4-connected components (a vectorised label
   propagation with pointer jumping; no scipy). Within a component, a pixel's *coverage* by the object is estimated
   as its chroma over the component's 90th-percentile chroma; the *core* is the pixels at least half covered. The
   core gives the object's area and box (GenEval's box); components whose core has fewer than ``0.004 * H * W``
   pixels (16 px at 64x64; the smallest object has 72) or a box side under ``H / 16`` are noise and are dropped.
4. **Shape** (:func:`classify_shape`). The coverage map (contrast doubled around 1/2, which undoes most of a mild
   blur) is compared with each shape hypothesis: circle, square, and triangle with its apex up, down, left or right
   (and the diamond, for a prompt of the enlarged grammar).
   Each hypothesis's box is fitted to the map's centroid and second moments (a square of side ``s`` has variance
   ``s^2 / 12`` along each axis, a circle of diameter ``d`` ``d^2 / 16``, an upright triangle of base ``b`` and
   height ``h`` ``b^2 / 24`` and ``h^2 / 18``, its centroid ``2h / 3`` below its apex), the shape is rendered there
   at 4x supersampling, and the soft IoU (sum of minima over sum of maxima) is taken. The best hypothesis names the
   shape if its IoU is at least 0.7 and its box aspect ratio is within [0.5, 2]; otherwise the blob has no shape
   and matches no noun. On rendered ground truth the true shape's IoU is 0.9-1.0 and beats the runner-up by more
   than 0.07, also with noise or a 1-px blur.

Rules (:func:`score`), after GenEval
------------------------------------
* ``single_object`` / ``colors``: at least one object of the shape (of the colour, if named).
* ``two_objects`` / ``color_attr``: at least one object matching each noun phrase (shape, and colour if named).
* ``counting``: exactly N objects of the shape (of the colour, if named); other objects are not counted.
* ``position``: both noun phrases are found, and the relation holds between the largest match of the first and the
  largest match of the second, with GenEval's rule on their box centres: the centre offset, shrunk along each axis
  by 0.1 x the sum of the two box sizes along it, is normalised by the offset's length, and "left of" holds when
  its x component is below -0.5 (right of: above +0.5; above: y below -0.5; below: y above +0.5; y points down).

:func:`score_batch` reports the per-category accuracies, their mean (GenEval's overall score) and the accuracy over
all images.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from diffusers_var_accel.lab.data.shapes import (
    ALL_PALETTE_HUE,
    CATEGORIES,
    Grammar,
    get_grammar,
    grammar_of,
    parse_prompt,
)

__all__ = [
    "classify_shape",
    "detect_objects",
    "relations_between",
    "score",
    "score_batch",
    "shape_geometry",
    "shape_holds",
]

ImageLike = Union[Image.Image, np.ndarray]

#: Background: RGB radius of a background colour, its least share of the border frame, border pixels examined.
BACKGROUND_DIST = 40.0
BACKGROUND_MIN_SHARE = 0.15
BACKGROUND_SAMPLES = 192
#: Colour: least chroma of an object pixel, largest hue distance (degrees) to its palette colour.
CHROMA_MIN = 40.0
HUE_TOL = 30.0
#: Components: least coverage of a core pixel, least core area (fraction of H * W) and box side (fraction of H).
CORE_FRACTION = 0.5
MIN_AREA_FRACTION = 0.004
MIN_SIDE_FRACTION = 1.0 / 16.0
#: Shape: contrast gain of the coverage map around 1/2, least IoU of the best shape hypothesis.
EDGE_GAIN = 2.0
MIN_SHAPE_IOU = 0.7
#: GenEval's relative-position threshold (fraction of the two boxes' summed size per axis).
POSITION_THRESHOLD = 0.1


def _hues(colors) -> np.ndarray:
    return np.array([ALL_PALETTE_HUE[c] for c in colors], dtype=np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Pixels
# ----------------------------------------------------------------------------------------------------------------


def _to_rgb(image: ImageLike) -> np.ndarray:
    """An ``(H, W, 3)`` float32 array in [0, 255] from a PIL image or an HWC / CHW / HW array (uint8 or [0, 1])."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.float32)
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
        arr = np.moveaxis(arr, 0, -1)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"expected an image array of shape (H, W, 3), got {arr.shape}")
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    arr = arr[..., :3]
    if np.issubdtype(arr.dtype, np.floating) and arr.size and float(np.nanmax(arr)) <= 1.0:
        arr = arr * 255.0
    return np.clip(np.nan_to_num(arr.astype(np.float32)), 0.0, 255.0)


def _hue_chroma(rgb: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-pixel hue in degrees [0, 360) and chroma ``max - min`` of an ``(..., 3)`` array."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    mx, mn = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    c = mx - mn
    safe = np.where(c > 0, c, 1.0)
    h = np.where(mx == r, ((g - b) / safe) % 6.0, np.where(mx == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    return (60.0 * h) % 360.0, c


def _background_colors(rgb: np.ndarray) -> List[np.ndarray]:
    """The densest colours of the border frame that each cover >= 15 % of it (greedy, radius 40)."""
    h, w, _ = rgb.shape
    bw = max(1, round(min(h, w) / 32))
    frame = np.ones((h, w), dtype=bool)
    frame[bw : h - bw, bw : w - bw] = False
    px = rgb[frame]
    if len(px) > BACKGROUND_SAMPLES:
        px = px[np.linspace(0, len(px) - 1, BACKGROUND_SAMPLES).astype(np.int64)]
    total = len(px)
    d2 = ((px[:, None, :] - px[None, :, :]) ** 2).sum(-1)
    near = d2 < BACKGROUND_DIST**2
    alive = np.ones(total, dtype=bool)
    colors = []
    for _ in range(4):
        counts = (near & alive[None, :]).sum(1) * alive
        k = int(np.argmax(counts))
        if counts[k] < BACKGROUND_MIN_SHARE * total:
            break
        members = near[k] & alive
        colors.append(px[members].mean(0))
        alive &= ~members
    return colors


def _connected_components(labels: np.ndarray) -> np.ndarray:
    """4-connected components of equal non-negative labels: an int array of component ids (-1 where label < 0).

    Label propagation (each pixel takes the smallest pixel index among its equal-label neighbours) with pointer
    jumping, until nothing changes; ids are the smallest flat index of each component.
    """
    h, w = labels.shape
    fg = labels >= 0
    big = h * w
    ids = np.where(fg, np.arange(big).reshape(h, w), big)
    right = fg[:, :-1] & (labels[:, :-1] == labels[:, 1:])
    down = fg[:-1, :] & (labels[:-1, :] == labels[1:, :])
    fg_flat = fg.ravel()
    while True:
        new = ids.copy()
        m = np.where(right, np.minimum(ids[:, :-1], ids[:, 1:]), big)
        new[:, :-1] = np.minimum(new[:, :-1], m)
        new[:, 1:] = np.minimum(new[:, 1:], m)
        m = np.where(down, np.minimum(ids[:-1, :], ids[1:, :]), big)
        new[:-1, :] = np.minimum(new[:-1, :], m)
        new[1:, :] = np.minimum(new[1:, :], m)
        flat = new.ravel()
        for _ in range(2):
            flat[fg_flat] = flat[flat[fg_flat]]
        if np.array_equal(new, ids):
            break
        ids = new
    return np.where(fg, ids, -1)


# ----------------------------------------------------------------------------------------------------------------
# Objects
# ----------------------------------------------------------------------------------------------------------------


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Whether points ``(u, v)`` of the unit box (u right, v down) lie inside the shape filling that box."""
    if shape == "circle":
        return (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25
    if shape == "square":
        return (u >= 0.0) & (u <= 1.0) & (v >= 0.0) & (v <= 1.0)
    if shape == "diamond":
        return np.abs(u - 0.5) + np.abs(v - 0.5) <= 0.5
    along, across = {"up": (v, u), "down": (1.0 - v, u), "left": (u, v), "right": (1.0 - u, v)}[shape.split("_")[1]]
    return (along >= 0.0) & (along <= 1.0) & (np.abs(across - 0.5) <= 0.5 * along)


#: For each shape hypothesis: (variance of x, variance of y) as multiples of (width^2, height^2) of its box, and the
#: box's top-left corner offset from the centroid as multiples of (width, height).
_HYPOTHESES: Dict[str, Tuple[float, float, float, float]] = {
    "circle": (1 / 16, 1 / 16, -1 / 2, -1 / 2),
    "square": (1 / 12, 1 / 12, -1 / 2, -1 / 2),
    "triangle_up": (1 / 24, 1 / 18, -1 / 2, -2 / 3),
    "triangle_down": (1 / 24, 1 / 18, -1 / 2, -1 / 3),
    "triangle_left": (1 / 18, 1 / 24, -2 / 3, -1 / 2),
    "triangle_right": (1 / 18, 1 / 24, -1 / 3, -1 / 2),
    "diamond": (1 / 24, 1 / 24, -1 / 2, -1 / 2),
}


def classify_shape(
    coverage: np.ndarray, shapes: Sequence[str] = ("circle", "square", "triangle")
) -> Tuple[Optional[str], Dict[str, float]]:
    """``(shape or None, features)`` of one object's coverage map (boolean or in [0, 1], zero off the object).

    For each hypothesis (circle, square, and the triangle with its apex up, down, left or right) the shape's box is
    fitted to the map's centroid and second moments (e.g. a square of side ``s`` has variance ``s^2 / 12`` along
    each axis, a circle of diameter ``d`` ``d^2 / 16``), the shape is rendered in that box at 4x supersampling, and
    compared with the map by soft IoU (sum of minima over sum of maxima). The best hypothesis names the shape if its
    IoU is at least :data:`MIN_SHAPE_IOU` and the fitted box's aspect ratio is within [0.5, 2]. ``features`` holds
    each shape's IoU (the best orientation's for the triangle) and ``aspect`` (box width / height). ``shapes``: the
    hypotheses, a grammar's shapes (the enlarged grammar adds the diamond, a square on its corner: variance ``s^2 /
    24`` along each axis).
    """
    m = np.asarray(coverage, dtype=np.float64)
    h, w = m.shape
    mass = float(m.sum())
    if mass <= 0:
        return None, {**{shape: 0.0 for shape in shapes}, "aspect": 1.0}
    ys, xs = np.arange(h) + 0.5, np.arange(w) + 0.5
    px, py = m.sum(0), m.sum(1)
    cx, cy = float(px @ xs) / mass, float(py @ ys) / mass
    vx, vy = float(px @ (xs - cx) ** 2) / mass, float(py @ (ys - cy) ** 2) / mass
    ss = 4
    sub = (np.arange(ss) + 0.5) / ss - 0.5
    gy = (ys[:, None] + sub[None, :]).ravel()
    gx = (xs[:, None] + sub[None, :]).ravel()
    feats: Dict[str, float] = {}
    best, best_iou, best_aspect = None, -1.0, 1.0
    for name, (kx, ky, ox, oy) in _HYPOTHESES.items():
        if name.split("_")[0] not in shapes:
            continue
        bw, bh = max(np.sqrt(vx / kx), 1e-3), max(np.sqrt(vy / ky), 1e-3)
        u = (gx - (cx + ox * bw)) / bw
        v = (gy - (cy + oy * bh)) / bh
        t = _inside(name, u[None, :], v[:, None]).reshape(h, ss, w, ss).mean((1, 3))
        inter = float(np.minimum(m, t).sum())
        iou = inter / max(float(np.maximum(m, t).sum()), 1e-9)
        shape = name.split("_")[0]
        feats[shape] = max(feats.get(shape, 0.0), iou)
        if iou > best_iou:
            best, best_iou, best_aspect = shape, iou, bw / bh
    feats["aspect"] = best_aspect
    if best_iou < MIN_SHAPE_IOU or not 0.5 <= best_aspect <= 2.0:
        best = None
    return best, feats


#: Strict shape rules (the default; ``strict=False`` gives the template fit alone): the largest elongation of a circle
#: or a square, and the largest outline harmonic a circle may show (see :func:`shape_geometry`).
MAX_ELONGATION = 1.25
MAX_CIRCLE_HARMONIC = 0.04
#: The harmonics of the outline that count corners, and the count each shape must show (a circle: none above
#: :data:`MAX_CIRCLE_HARMONIC`).
CORNER_HARMONICS: Tuple[int, ...] = (3, 4, 5, 6, 7, 8)
SHAPE_CORNERS: Dict[str, int] = {"circle": 0, "square": 4, "diamond": 4, "triangle": 3}
_POLYGON_HARMONICS: Tuple[int, ...] = (5, 6, 7, 8)
#: Rays and step (pixels) of the outline's radial profile.
_RAYS = 96
_RAY_STEP = 0.25


def _bilinear(m: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``m`` sampled at coordinates ``(x, y)`` (pixel ``i`` spans ``[i, i + 1)``, its value at ``i + 0.5``), zero
    outside."""
    h, w = m.shape
    padded = np.pad(m, 1)
    fx, fy = x + 0.5, y + 0.5
    x0 = np.clip(np.floor(fx).astype(int), 0, w)
    y0 = np.clip(np.floor(fy).astype(int), 0, h)
    ax, ay = np.clip(fx - x0, 0.0, 1.0), np.clip(fy - y0, 0.0, 1.0)
    return (
        padded[y0, x0] * (1 - ax) * (1 - ay)
        + padded[y0, x0 + 1] * ax * (1 - ay)
        + padded[y0 + 1, x0] * (1 - ax) * ay
        + padded[y0 + 1, x0 + 1] * ax * ay
    )


def shape_geometry(coverage: np.ndarray) -> Dict[str, float]:
    """What the strict rules read of an object's coverage map.

    ``elongation``: the square root of the ratio of its principal second moments (1 for a circle or a square, 1.5
    for a 1.5 : 1 rectangle or ellipse, whatever its orientation). ``h1`` .. ``h8``: the amplitudes of the harmonics
    of its outline's radial profile about the centroid (the distance to the edge along 96 rays, each the coverage
    summed along the ray at quarter-pixel steps), over the mean radius. A regular n-gon's corners are its n-th
    harmonic (measured on rendered shapes at 12-24 px: hexagon 0.05-0.06, pentagon 0.08, square 0.14, the world's
    triangle 0.27); a circle shows pixel noise only (under 0.01); an octagon's 0.03 is below what the rules tell
    from a circle. ``corners``: the strongest of the harmonics 3-8, or 0 when none exceeds
    :data:`MAX_CIRCLE_HARMONIC`.
    """
    m = np.asarray(coverage, dtype=np.float64)
    h, w = m.shape
    mass = float(m.sum())
    if mass <= 0:
        return {"elongation": float("inf"), "corners": 0, **{f"h{k}": 0.0 for k in range(1, 9)}}
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    cx, cy = float((m * xs).sum()) / mass, float((m * ys).sum()) / mass
    dx, dy = xs - cx, ys - cy
    cov = np.array([[(m * dx * dx).sum(), (m * dx * dy).sum()], [(m * dx * dy).sum(), (m * dy * dy).sum()]]) / mass
    low, high = np.linalg.eigvalsh(cov)
    angles = 2 * np.pi * np.arange(_RAYS) / _RAYS
    steps = np.arange(_RAY_STEP / 2, np.hypot(h, w), _RAY_STEP)
    radius = (
        _bilinear(m, cx + np.cos(angles)[:, None] * steps, cy + np.sin(angles)[:, None] * steps).sum(1) * _RAY_STEP
    )
    spectrum = np.abs(np.fft.rfft(radius)) * 2 / _RAYS / max(float(radius.mean()), 1e-9)
    harmonics = {f"h{k}": float(spectrum[k]) for k in range(1, 9)}
    strongest = max(CORNER_HARMONICS, key=lambda k: harmonics[f"h{k}"])
    return {
        "elongation": float(np.sqrt(high / max(low, 1e-9))),
        "corners": strongest if harmonics[f"h{strongest}"] > MAX_CIRCLE_HARMONIC else 0,
        **harmonics,
    }


def shape_holds(shape: str, geometry: Dict[str, float]) -> Tuple[bool, str]:
    """The strict rules for a shape the template fit named: a circle, a square or a diamond is not elongated (at
    most :data:`MAX_ELONGATION`: not an ellipse, not a rectangle), and each shows its corners
    (:data:`SHAPE_CORNERS`: a square four; a triangle three, so not a square); a circle shows no harmonic 5-8 above
    :data:`MAX_CIRCLE_HARMONIC` (not a pentagon, hexagon, ...: no template has those corners; a blob with three or
    four lumps was already ranked against the triangle and square templates).
    ``(holds, why not)``."""
    elongation = geometry["elongation"]
    if shape in ("circle", "square", "diamond") and elongation > MAX_ELONGATION:
        return False, f"elongated {elongation:.2f} : 1"
    if shape == "circle":
        # Three or four corners are the triangle's and the square's templates, which the fit already ranked below
        # the circle; five to eight corners no template has, so a pentagon or a hexagon would pass for a circle.
        k = max(_POLYGON_HARMONICS, key=lambda j: geometry[f"h{j}"])
        if geometry[f"h{k}"] > MAX_CIRCLE_HARMONIC:
            return False, f"{k} corners (harmonic {geometry[f'h{k}']:.3f})"
        return True, ""
    if geometry["corners"] != SHAPE_CORNERS[shape]:
        return False, f"{geometry['corners']} corners, {SHAPE_CORNERS[shape]} wanted"
    return True, ""


def detect_objects(
    image: ImageLike, grammar: Union[str, Grammar] = "original", strict: bool = True
) -> List[Dict[str, Any]]:
    """The objects seen in an image, largest first.

    Each is ``{"shape": str | None, "color": str, "area": int, "box": (x0, y0, x1, y1), "center": (x, y),
    "features": {...}}`` with the box in pixels (x1, y1 exclusive) and the box centre as fractions of the image
    width and height; ``shape`` is None for blobs that are none of the grammar's shapes. Colours and shapes are
    those of ``grammar`` (:data:`~diffusers_var_accel.lab.data.shapes.GRAMMARS`; the original one: circle, square,
    triangle in six colours). ``strict`` (default): a shape the template fit names must also pass
    :func:`shape_holds` (else ``shape`` is None and ``features["rejected"]`` says why); ``False``: the template fit
    alone, the scorer before 2026-12-06.
    """
    grammar = get_grammar(grammar)
    colors = grammar.colors
    rgb = _to_rgb(image)
    h, w, _ = rgb.shape
    hue, chroma = _hue_chroma(rgb)
    dist = np.abs(hue[..., None] - _hues(colors))
    dist = np.minimum(dist, 360.0 - dist)
    nearest = dist.argmin(-1)
    chromatic = (chroma >= CHROMA_MIN) & (np.take_along_axis(dist, nearest[..., None], -1)[..., 0] <= HUE_TOL)
    for bg in _background_colors(rgb):
        diff = rgb - bg
        chromatic &= np.einsum("hwc,hwc->hw", diff, diff) >= BACKGROUND_DIST**2
    labels = np.where(chromatic, nearest, -1)
    comp = _connected_components(labels)

    ids = comp[comp >= 0]
    if ids.size == 0:
        return []
    uniq, counts = np.unique(ids, return_counts=True)
    min_area = MIN_AREA_FRACTION * h * w
    min_side = MIN_SIDE_FRACTION * min(h, w)
    objects = []
    for cid in uniq[counts >= min_area]:
        member = comp == cid
        ref = float(np.percentile(chroma[member], 90))
        core = member & (chroma >= CORE_FRACTION * ref)
        area = int(core.sum())
        if area < min_area:
            continue
        ys, xs = np.nonzero(core)
        x0, x1, y0, y1 = int(xs.min()), int(xs.max()) + 1, int(ys.min()), int(ys.max()) + 1
        if min(x1 - x0, y1 - y0) < min_side:
            continue
        coverage = np.where(member, np.clip((chroma / max(ref, 1e-6) - 0.5) * EDGE_GAIN + 0.5, 0.0, 1.0), 0.0)
        cy0, cy1, cx0, cx1 = max(y0 - 2, 0), min(y1 + 2, h), max(x0 - 2, 0), min(x1 + 2, w)
        crop = coverage[cy0:cy1, cx0:cx1]
        shape, feats = classify_shape(crop, grammar.shapes)
        if strict and shape is not None:
            geometry = shape_geometry(crop)
            holds, why = shape_holds(shape, geometry)
            feats = {**feats, **geometry, "template_shape": shape}
            if not holds:
                shape, feats["rejected"] = None, why
        color = colors[int(labels.flat[int(cid)])]
        objects.append(
            {
                "shape": shape,
                "color": color,
                "area": area,
                "box": (x0, y0, x1, y1),
                "center": ((x0 + x1) / 2.0 / w, (y0 + y1) / 2.0 / h),
                "features": feats,
            }
        )
    objects.sort(key=lambda o: -o["area"])
    return objects


def relations_between(a: Dict[str, Any], b: Dict[str, Any]) -> set:
    """GenEval's relations of detected object ``a`` to ``b`` ("left of", "right of", "above", "below")."""
    ba, bb = np.asarray(a["box"], dtype=np.float64), np.asarray(b["box"], dtype=np.float64)
    center_a, center_b = (ba[:2] + ba[2:]) / 2.0, (bb[:2] + bb[2:]) / 2.0
    dim_a, dim_b = ba[2:] - ba[:2], bb[2:] - bb[:2]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - POSITION_THRESHOLD * (dim_a + dim_b), 0.0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


# ----------------------------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------------------------


def _matches(objects: List[Dict[str, Any]], want: Dict[str, Any]) -> List[Dict[str, Any]]:
    color = want["color"]
    return [o for o in objects if o["shape"] == want["shape"] and (color is None or o["color"] == color)]


def _describe(want: Dict[str, Any]) -> str:
    return " ".join(x for x in (want["color"], want["shape"]) if x)


def score(
    prompt: str, image: ImageLike, grammar: Union[str, Grammar, None] = None, strict: bool = True
) -> Dict[str, Any]:
    """Whether ``image`` satisfies ``prompt`` (GenEval-style rules in the module docstring).

    Returns ``{"correct": bool, "category": str, "details": {"parsed", "objects", "reason"}}``; raises
    ``ValueError`` for a prompt outside the shapes grammar. Colours and shapes are read within ``grammar``, the world
    the image was drawn for (:data:`~diffusers_var_accel.lab.data.shapes.GRAMMARS`); by default the smallest grammar that
    says the prompt (:func:`~diffusers_var_accel.lab.data.shapes.grammar_of`), so a prompt of the original grammar is
    judged as it was before the grammar grew. Give ``"enlarged"`` for images of a model of the enlarged world, whose
    objects of unnamed colour may be pink or cyan. ``strict`` (default): see :func:`detect_objects`; ``False`` is the
    lenient scorer before 2026-12-06, which took a 1.5 : 1 rectangle for a square and a hexagon for a circle.
    """
    meaning = parse_prompt(prompt)
    category = meaning["category"]
    world = grammar_of(meaning)
    if grammar is not None:
        grammar = get_grammar(grammar)
        if not set(world.words()) <= set(grammar.words()):
            raise ValueError(f"prompt {prompt!r} uses words outside the grammar {grammar.name!r}")
        world = grammar
    objects = detect_objects(image, world, strict=strict)
    wants = meaning["objects"]
    found = [_matches(objects, want) for want in wants]
    correct, reason = True, "ok"
    if category == "counting":
        n = wants[0]["count"]
        if len(found[0]) != n:
            correct, reason = False, f"{len(found[0])} {_describe(wants[0])}(s) found, {n} wanted"
    else:
        missing = [_describe(want) for want, f in zip(wants, found) if not f]
        if missing:
            correct, reason = False, "missing " + " and ".join(missing)
        elif category == "position":
            rels = relations_between(found[0][0], found[1][0])
            if meaning["relation"] not in rels:
                correct, reason = False, f"relation {meaning['relation']!r} does not hold (found {sorted(rels)})"
    slim = [{k: v for k, v in o.items() if k != "features"} for o in objects]
    return {
        "correct": correct,
        "category": category,
        "details": {"parsed": meaning, "objects": slim, "reason": reason},
    }


def score_batch(
    prompts: Sequence[str],
    images: Sequence[ImageLike],
    grammar: Union[str, Grammar, None] = None,
    strict: bool = True,
) -> Dict[str, Any]:
    """Score many (prompt, image) pairs (``grammar``, ``strict``: see :func:`score`).

    Returns ``{"per_category": {category: accuracy}, "overall": mean of the per-category accuracies (GenEval's
    score), "overall_images": accuracy over all images, "n": number of images, "n_per_category": {...},
    "correct": [bool per image]}``; categories without images are left out.
    """
    if len(prompts) != len(images):
        raise ValueError(f"{len(prompts)} prompts but {len(images)} images")
    hits: Dict[str, List[bool]] = {}
    flags = []
    for prompt, image in zip(prompts, images):
        r = score(prompt, image, grammar, strict=strict)
        hits.setdefault(r["category"], []).append(r["correct"])
        flags.append(r["correct"])
    per_category = {c: float(np.mean(hits[c])) for c in CATEGORIES if c in hits}
    return {
        "per_category": per_category,
        "overall": float(np.mean(list(per_category.values()))) if per_category else 0.0,
        "overall_images": float(np.mean(flags)) if flags else 0.0,
        "n": len(flags),
        "n_per_category": {c: len(hits[c]) for c in CATEGORIES if c in hits},
        "correct": flags,
    }
