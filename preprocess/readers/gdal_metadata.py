"""GDAL's metadata as hsgds reads it: the items of a GeoTIFF's GDAL_METADATA tag (band centres, band names, a bad
band list, band scales and offsets) and the PAM sidecar ``<raster>.aux.xml`` GDAL keeps beside a raster whose
format cannot hold what was set on it (``gdal_edit.py``, ``SetMetadata`` / ``SetScale`` / ``SetNoDataValue`` on a
read-only dataset).

A PAM file is read as GDAL reads it: after the format's own metadata, each of its items replacing the item of
the same name (case-insensitive), band and domain, each band's description, scale, offset and nodata value
replacing that band's. Its items are turned into the tag's ``<Item>`` elements and merged with the format's own
(the tag's, or those an ENVI header gives), so one set of parsers reads both.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hsgds.errors import InputError
from hsgds.preprocess.readers.base import OVERRIDE_NODATA, bad_band_list, parse_nodata, wavelengths_in_nm

__all__ = ["PAM_SUFFIX", "Pam", "bad_bands", "band_centres", "band_descriptions", "band_packing", "gdal_items",
           "metadata_item", "read_pam"]

#: what GDAL appends to a raster's file name for its PAM sidecar (``scene.tif.aux.xml``, ``scene.img.aux.xml``)
PAM_SUFFIX = ".aux.xml"
#: a PAM file larger than this is not parsed (one with histograms of hundreds of bands is a few MB)
_MAX_PAM = 64 << 20
#: the metadata domains whose items hsgds reads: GDAL's default one and IMAGERY (``CENTRAL_WAVELENGTH_UM``)
_DOMAINS = ("", "IMAGERY")
#: the item names that give band centres
_WAVELENGTH_ITEMS = ("WAVELENGTH", "WAVELENGTH_UNITS", "CENTRAL_WAVELENGTH_UM")
#: a PAM band's elements that GDAL reads as the band's description, scale and offset, and the role the tag gives each
_BAND_ROLES = {"Description": "description", "Scale": "scale", "Offset": "offset"}


def metadata_item(name: str, text: str, sample: int | None = None, role: str | None = None, domain: str = "") -> ET.Element:
    """One ``<Item>`` of GDAL's metadata tag (``sample`` counted from 0)."""
    attrs = {"name": name}
    if sample is not None:
        attrs["sample"] = str(sample)
    if role is not None:
        attrs["role"] = role
    if domain:
        attrs["domain"] = domain
    element = ET.Element("Item", attrs)
    element.text = text
    return element


def _key(item: ET.Element) -> tuple[str, str, str]:
    """What makes an item replace another, as GDAL merges metadata: a band's role (description, scale, offset), or
    a name (case-insensitive, as GDAL's lists compare names) in a domain; each for the dataset or one band."""
    role = (item.get("role") or "").lower()
    sample = (item.get("sample") or "").strip()
    if role:
        return "role", role, sample
    return (item.get("name") or "").upper(), sample, item.get("domain") or ""


@dataclass
class Pam:
    """The items of a raster's PAM sidecar that hsgds reads, as the tag's ``<Item>`` elements, and each band's
    ``NoDataValue`` (by band index from 0, as text)."""

    path: Path
    items: list[ET.Element] = field(default_factory=list)
    nodata: dict[int, str] = field(default_factory=dict)

    def gives(self, what: str) -> bool:
        """Whether the sidecar gives (or overrides) ``what``: "wavelengths", "band names", "bad bands", "scales"
        (scales or offsets) or "nodata"."""
        if what == "nodata":
            return bool(self.nodata)
        keys = {_key(item)[:2] for item in self.items}
        if what == "wavelengths":
            return any(name in _WAVELENGTH_ITEMS for name, _ in keys)
        if what == "band names":
            return any(k == ("role", "description") for k in keys)
        if what == "bad bands":
            return ("BBL", "") in keys
        if what == "scales":
            return any(k in (("role", "scale"), ("role", "offset")) for k in keys)
        raise ValueError(f"unknown PAM item kind {what!r}")

    @property
    def used(self) -> bool:
        """Whether it gives anything hsgds reads (a sidecar holding only statistics or histograms gives nothing)."""
        return any(self.gives(what) for what in ("wavelengths", "band names", "bad bands", "scales", "nodata"))

    def over(self, own: list[ET.Element]) -> str:
        """The format's own items ``own`` with this sidecar's merged over them, as the text of a GDAL metadata tag."""
        merged = {_key(item): item for item in own}
        merged.update((_key(item), item) for item in self.items)
        root = ET.Element("GDALMetadata")
        root.extend(merged.values())
        return ET.tostring(root, encoding="unicode")

    def nodata_over(self, own: float | None, own_error: str | None, bands: int,
                    where: str) -> tuple[float | None, str | None]:
        """The cube's nodata value (or None) and why it cannot be used (or None), once each band's ``NoDataValue``
        replaces the format's own ``own`` (or its error ``own_error``) for that band. hsgds records one value for
        all bands: bands left with different values (or some with none) make an error, raised only when it is
        used (``--nodata`` may override it), like a value that is no number."""
        fix = f"fix its <NoDataValue> (gdal_edit.py -a_nodata VALUE) or remove it, {OVERRIDE_NODATA}"
        values: dict[int, float | None] = {}
        for band, text in self.nodata.items():
            try:
                values[band] = parse_nodata(text, f"{self.path.name} (band {band + 1})", fix)
            except InputError as exc:
                return None, str(exc)
        if len(values) < bands:  # the other bands keep the format's own
            if own_error is not None:
                return None, own_error
            values.update((b, own) for b in range(bands) if b not in values)
        distinct = {None if v is None else "nan" if math.isnan(v) else v for v in values.values()}
        if len(distinct) == 1:
            return values[0], None
        shown = ", ".join(f"band {b + 1}: {'none' if values[b] is None else f'{values[b]:g}'}" for b in sorted(values))
        return None, (f"{where}: its bands' nodata values differ ({shown[:200]}); hsgds records one for all bands: "
                      f"give every band the same (gdal_edit.py -a_nodata VALUE), {OVERRIDE_NODATA}")


def read_pam(raster: Path, bands: int) -> Pam | None:
    """The PAM sidecar GDAL reads beside ``raster`` (``raster`` + ``.aux.xml``), or None when there is none.

    Dataset and band ``<Metadata>`` of the default and IMAGERY domains become items (a band's with its
    ``sample``), a band's ``<Description>``, ``<Scale>`` and ``<Offset>`` role items, as the tag has them.

    Raises
    ------
    InputError
        The sidecar is no XML, no PAM file (its root is not ``<PAMDataset>``), or describes a band the raster does
        not have (it belongs to another raster): GDAL would ignore it, or part of it, without a word that matters.
    """
    path = raster.with_name(raster.name + PAM_SUFFIX)
    if not path.is_file():
        return None
    fix = "fix it or remove it (GDAL keeps a raster's metadata there when the raster itself cannot hold it)"
    try:
        if path.stat().st_size > _MAX_PAM:
            raise InputError(f"{path}: it is larger than {_MAX_PAM >> 20} MiB, too large for a PAM sidecar of "
                             f"{raster.name}; {fix}")
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise InputError(f"{path} is not well-formed XML ({exc}), so what it sets on {raster.name} cannot be "
                         f"read; {fix}") from None
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror or exc}); check its permissions") from None
    except (ValueError, LookupError) as exc:  # expat on an unknown or false encoding declaration
        raise InputError(f"{path} cannot be parsed as XML ({type(exc).__name__}: {exc}); {fix}") from None
    if root.tag != "PAMDataset":
        raise InputError(f"{path} is no GDAL PAM file (its root element is <{root.tag[:40]}>, not <PAMDataset>); {fix}")
    pam = Pam(path)
    pam.items.extend(_metadata_items(root, None))
    seen: set[int] = set()
    for element in root.findall("PAMRasterBand"):
        number = (element.get("band") or "").strip()
        valid = number.isascii() and number.isdigit()
        if valid and int(number) in seen:
            raise InputError(f"{path} describes band {number} twice (two PAMRasterBand elements): it is damaged; {fix}")
        if not valid or not 1 <= int(number) <= bands:
            what = f"band {number[:20]}" if number else "a band without a number"
            raise InputError(f"{path} describes {what}, but {raster.name} has {bands} bands (1 to {bands}): it "
                             "belongs to another raster or is damaged; remove it, or fix its PAMRasterBand numbers")
        seen.add(int(number))
        band = int(number) - 1
        pam.items.extend(_metadata_items(element, band))
        for tag, role in _BAND_ROLES.items():
            text = element.findtext(tag)
            if text is not None:
                pam.items.append(metadata_item(tag.upper(), text.strip(), band, role))
        text = element.findtext("NoDataValue")
        if text is not None:
            pam.nodata[band] = text.strip()
    return pam


def _metadata_items(element: ET.Element, band: int | None) -> list[ET.Element]:
    """The ``<MDI key=...>`` items of an element's ``<Metadata>`` blocks in the domains hsgds reads."""
    items = []
    for block in element.findall("Metadata"):
        domain = block.get("domain") or ""
        if domain not in _DOMAINS or block.get("format"):  # (format="xml": one XML document, no items)
            continue
        items.extend(metadata_item(mdi.get("key") or "", (mdi.text or "").strip(), band, domain=domain)
                     for mdi in block.findall("MDI"))
    return items


def band_centres(text: str | None, bands: int, where: str) -> tuple[list[float] | None, str | None]:
    """Band centres in nm from GDAL's metadata tag (XML): per-band ``wavelength`` items in their
    ``wavelength_units`` (a band's own, else the dataset's: what gdal_translate keeps of an ENVI file's header),
    else GDAL's standard ``CENTRAL_WAVELENGTH_UM``; and None, or None and why they are not recorded (``where``
    starts it). (None, None) when none."""
    if not text:
        return None, None
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None, f"{where}: its GDAL_METADATA tag is not XML, so its wavelengths are unreadable"
    per_band: dict[str, dict[int, str]] = {}
    units = ""
    for item in root.iter("Item"):
        name, sample = (item.get("name") or "").lower(), item.get("sample")
        if sample is None:
            units = (item.text or "").strip() if name == "wavelength_units" else units
        elif sample.isdigit():
            per_band.setdefault(name, {})[int(sample)] = (item.text or "").strip()
    if "wavelength" in per_band:
        found = per_band["wavelength"]
        own = per_band.get("wavelength_units", {})
        listed = {own.get(b, units) for b in found} - {""}  # (a band without units takes the others')
        if len(listed) > 1:
            return None, f"{where}: its bands' wavelength_units differ ({', '.join(sorted(listed))})"
        units = listed.pop() if listed else ""
    elif "central_wavelength_um" in per_band:
        found, units = per_band["central_wavelength_um"], "micrometers"
    else:
        return None, None
    if sorted(found) != list(range(bands)):
        return None, f"{where}: its GDAL metadata gives wavelengths for {len(found)} of its {bands} bands"
    try:
        values = [float(found[b]) for b in range(bands)]
    except ValueError:
        return None, f"{where}: a band's wavelength in its GDAL metadata is not a number"
    if not all(math.isfinite(v) for v in values):
        return None, f"{where}: its GDAL metadata's wavelengths include NaN or infinity"
    return wavelengths_in_nm(values, units, where)


def gdal_items(text: str | None) -> list[ET.Element]:
    """The ``Item`` elements of GDAL's metadata tag; none when there is no tag or it is no XML (:func:`band_centres`
    names an unreadable tag)."""
    if not text:
        return []
    try:
        return list(ET.fromstring(text).iter("Item"))
    except ET.ParseError:
        return []


def band_descriptions(text: str | None, bands: int) -> list[str] | None:
    """Band names from GDAL's metadata tag: each band's ``DESCRIPTION`` item (what gdal_translate keeps of an ENVI
    header's band names, and rasterio's ``descriptions``), or None unless every band has one."""
    names = {int(item.get("sample") or ""): (item.text or "").strip() for item in gdal_items(text)
             if (item.get("name") or "").upper() == "DESCRIPTION" and (item.get("sample") or "").isdigit()
             and (item.get("role") or "description") == "description"}
    if sorted(names) != list(range(bands)) or not all(names.values()):
        return None
    return [names[b] for b in range(bands)]


def bad_bands(text: str | None, bands: int, where: str) -> list[int] | None:
    """The bands an ENVI bad band list in GDAL's metadata tag flags bad (a dataset item ``bbl``, ``{1, 0, ...}``: what
    rasterio's ``update_tags(bbl=...)`` writes, or gdal_translate of an ENVI file with ``-co COPY_SRC_MDD=YES``), or
    None when it has none."""
    for item in gdal_items(text):
        if (item.get("name") or "").lower() == "bbl" and item.get("sample") is None:
            return bad_band_list(item.text or "", bands, f"{where}'s GDAL metadata", "fix or remove its bbl item")
    return None


#: the roles GDAL gives its per-band scale and offset items in the GDAL_METADATA tag, and the value each has
#: when a band has none
_PACKING_ROLES = {"scale": 1.0, "offset": 0.0}


def band_packing(text: str | None, bands: int, where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Each band's scale and offset from GDAL's metadata tag (``<Item name="SCALE" sample="0" role="scale">``,
    what GDAL's SetScale / SetOffset and rasterio's ``scales`` / ``offsets`` write: int16 reflectance times
    0.0001), as float64 arrays of ``bands`` values (1 and 0 for a band without them), or None when no band has
    any but 1 and 0. Physical values are ``raw * scale + offset``, as GDAL's unscaling gives them.

    Raises
    ------
    InputError
        A scale or offset is no finite number, or names a band the image does not have; or the tag holds scale
        items but is no XML (the values would otherwise be read raw, without a word).
    """
    if not text:
        return None
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        if any(f'role="{role}"' in text for role in _PACKING_ROLES):
            raise InputError(f"{where}: its GDAL_METADATA tag holds band scales or offsets but is not XML, so "
                             "they cannot be applied; fix the tag (gdal_edit.py -scale / -offset rewrites them)") from None
        return None
    found = {role: np.full(bands, default) for role, default in _PACKING_ROLES.items()}
    for item in root.iter("Item"):
        role, sample = (item.get("role") or "").lower(), (item.get("sample") or "").strip()
        if role not in found or not sample.isdigit():
            continue
        value = (item.text or "").strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise InputError(f"{where}: its GDAL metadata gives band {sample} the {role} {value[:40]!r}, not a "
                             f"finite number; fix it (gdal_edit.py -{role} ...) or remove it")
        if int(sample) >= bands:
            raise InputError(f"{where}: its GDAL metadata gives a {role} to band {sample}, but the image has "
                             f"{bands} bands (0 to {bands - 1}); fix or remove that item")
        found[role][int(sample)] = number
    if (found["scale"] == 1).all() and (found["offset"] == 0).all():
        return None
    return found["scale"], found["offset"]
