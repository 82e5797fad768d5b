"""Real cities for the site simulator: coordinates, time zone, size, and RTT from distance.

RTT between two sites = ``BASE_RTT_MS`` + great-circle km / ``KM_PER_RTT_MS``:
light in fibre covers ~200 km per ms one way, so ~100 km per ms of round
trip over a roughly straight path; the 1 ms base stands for the last mile,
switching and the front's own hop. Real paths are longer than great
circles, so these RTTs are a lower bound; only their ordering and
ratios matter to the policies compared.

UTC offsets are standard time (no DST). ``permits``: a site's size, 32 for
the large hubs, 16 for regional sites, 8 for small ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BASE_RTT_MS = 1.0
KM_PER_RTT_MS = 100.0
EARTH_RADIUS_KM = 6371.0


@dataclass(frozen=True)
class City:
    name: str
    region: str
    lat: float
    lon: float
    utc_offset_h: float
    permits: int


_TABLE = """
Europe London 51.51 -0.13 0 32 | Frankfurt 50.11 8.68 1 32 | Amsterdam 52.37 4.90 1 32
Europe Paris 48.86 2.35 1 32 | Brussels 50.85 4.35 1 16 | Zurich 47.37 8.54 1 16 | Milan 45.46 9.19 1 16
Europe Madrid 40.42 -3.70 1 16 | Lisbon 38.72 -9.14 0 8 | Dublin 53.35 -6.26 0 16 | Copenhagen 55.68 12.57 1 16
Europe Stockholm 59.33 18.07 1 16 | Warsaw 52.23 21.01 1 16 | Vienna 48.21 16.37 1 16 | Prague 50.08 14.44 1 8
Europe Munich 48.14 11.58 1 16 | Hamburg 53.55 9.99 1 8 | Marseille 43.30 5.37 1 16 | Athens 37.98 23.73 2 8
Europe Helsinki 60.17 24.94 2 8 | Bucharest 44.43 26.10 2 8 | Istanbul 41.01 28.98 3 16 | Moscow 55.76 37.62 3 16
NorthAmerica NewYork 40.71 -74.01 -5 32 | Ashburn 39.04 -77.49 -5 32 | Toronto 43.65 -79.38 -5 16
NorthAmerica Chicago 41.88 -87.63 -6 32 | Atlanta 33.75 -84.39 -5 16 | Miami 25.76 -80.19 -5 16
NorthAmerica Dallas 32.78 -96.80 -6 16 | Denver 39.74 -104.99 -7 16 | Phoenix 33.45 -112.07 -7 8
NorthAmerica LosAngeles 34.05 -118.24 -8 32 | SanJose 37.34 -121.89 -8 32 | Seattle 47.61 -122.33 -8 16
NorthAmerica Vancouver 49.28 -123.12 -8 8 | Montreal 45.50 -73.57 -5 8 | MexicoCity 19.43 -99.13 -6 16
SouthAmerica SaoPaulo -23.55 -46.63 -3 32 | Rio -22.91 -43.17 -3 16 | BuenosAires -34.60 -58.38 -3 16
SouthAmerica Santiago -33.45 -70.67 -4 8 | Lima -12.05 -77.04 -5 8 | Bogota 4.71 -74.07 -5 8
Asia Tokyo 35.68 139.69 9 32 | Osaka 34.69 135.50 9 16 | Seoul 37.57 126.98 9 16 | HongKong 22.32 114.17 8 32
Asia Taipei 25.03 121.57 8 16 | Shanghai 31.23 121.47 8 16 | Singapore 1.35 103.82 8 32 | Mumbai 19.08 72.88 5.5 32
Asia Delhi 28.61 77.21 5.5 16 | Chennai 13.08 80.27 5.5 16 | Bangkok 13.76 100.50 7 16 | Jakarta -6.21 106.85 7 16
Asia Manila 14.60 120.98 8 8 | Dubai 25.20 55.27 4 16 | TelAviv 32.09 34.78 2 8
Oceania Sydney -33.87 151.21 10 32 | Melbourne -37.81 144.96 10 16 | Brisbane -27.47 153.03 10 8
Oceania Perth -31.95 115.86 8 8 | Auckland -36.85 174.76 12 8 | Honolulu 21.31 -157.86 -10 8
Africa Johannesburg -26.20 28.05 2 16 | CapeTown -33.92 18.42 2 8 | Lagos 6.52 3.38 1 8
Africa Nairobi -1.29 36.82 3 8 | Cairo 30.04 31.24 2 16
"""


def _parse(table: str) -> list[City]:
    out = []
    for line in table.strip().splitlines():
        region, rest = line.split(" ", 1)
        for entry in rest.split("|"):
            name, lat, lon, utc, permits = entry.split()
            out.append(City(name, region, float(lat), float(lon), float(utc), int(permits)))
    return out


CITIES: list[City] = _parse(_TABLE)
CITY = {c.name: c for c in CITIES}


def pick(n: int, must: str | None = None) -> list[City]:
    """``n`` cities spread over the regions: the table's order within a region, the regions taken
    in turn (so any ``n`` is global); ``must`` is always among them. Raises ValueError if ``n`` is
    out of range or ``must`` is unknown."""
    if not 2 <= n <= len(CITIES):
        raise ValueError(f"sites must be in [2, {len(CITIES)}], got {n}")
    if must is not None and must not in CITY:
        raise ValueError(f"unknown city {must!r}; known: {', '.join(sorted(CITY))}")
    by_region: dict[str, list[City]] = {}
    for c in CITIES:
        by_region.setdefault(c.region, []).append(c)
    order: list[City] = []
    for i in range(max(len(v) for v in by_region.values())):
        order += [v[i] for v in by_region.values() if i < len(v)]
    chosen = order[:n]
    if must is not None and CITY[must] not in chosen:
        chosen[-1] = CITY[must]
    return sorted(chosen, key=lambda c: CITIES.index(c))


def great_circle_km(a: City, b: City) -> float:
    """Haversine distance on a spherical Earth."""
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def rtt_s(a: City, b: City) -> float:
    """The modelled round trip between two sites, in seconds (0 to itself)."""
    if a == b:
        return 0.0
    return (BASE_RTT_MS + great_circle_km(a, b) / KM_PER_RTT_MS) / 1000.0


def diurnal(local_hour: float) -> float:
    """Relative load at a local time of day: 0.2 at 04:00, 1.0 at 16:00, a cosine in between."""
    return 0.2 + 0.8 * (0.5 - 0.5 * math.cos(2 * math.pi * ((local_hour - 4.0) % 24.0) / 24.0))


def neighbour_hop_s(cities: list[City]) -> dict[str, float]:
    """Each site's RTT to its nearest other site among ``cities``: one neighbour hop from there."""
    return {a.name: min(rtt_s(a, b) for b in cities if b is not a) for a in cities}


def fleet_hop_s(cities: list[City]) -> float:
    """The median over sites of ``neighbour_hop_s``: a typical neighbour hop in the fleet."""
    hops = sorted(neighbour_hop_s(cities).values())
    mid = len(hops) // 2
    return hops[mid] if len(hops) % 2 else (hops[mid - 1] + hops[mid]) / 2
