"""What the synthetic applicants are made of: the values drawn from, and their shares.

The vendors, statuses and phone kinds are those the mirrored API publishes; names,
places, pets and incomes are plausible and awkward on purpose (see `generator.py`).
"""

from __future__ import annotations

from typing import Final

INTEGRATIONS: Final = (
    ("int_mri_01", "MRI"),
    ("int_mri_02", "MRI"),
    ("int_entrata_01", "ENTRATA"),
    ("int_realpage_01", "REALPAGE"),
    ("int_buildium_01", "BUILDIUM"),
    ("int_resman_01", "RESMAN"),
)
PROPERTIES_PER_INTEGRATION: Final = 40
FIRST_NAMES: Final = (
    "Olivia", "Liam", "Emma", "Noah", "Ava", "Elijah", "Sophia", "James", "Isabella",
    "William", "Mia", "Benjamin", "Charlotte", "Lucas", "Amelia", "Henry", "Harper",
    "Theodore", "Evelyn", "Mateo", "José", "Zoë", "Chloé", "Łukasz", "Søren", "Aaliyah",
    "Mei", "Hiroshi", "Priya", "Oluwaseun",
)  # fmt: skip
MIDDLE_NAMES: Final = ("A.", "Marie", "Lee", "James", "Rose", "Ann", "J.", "Grace", "Ray")
LAST_NAMES: Final = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis",
    "Rodriguez", "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson",
    "Thomas", "Taylor", "Moore", "Jackson", "Martin", "Lee", "Pérez", "Thompson", "White",
    "Harris", "Sánchez", "Clark", "Ramírez", "Lewis", "Robinson", "O'Brien", "van der Berg",
    "Nguyen", "Kim", "Patel", "Müller",
)  # fmt: skip
CITIES: Final = (
    ("Austin", "TX", "787"), ("Dallas", "TX", "752"), ("Houston", "TX", "770"),
    ("Denver", "CO", "802"), ("Phoenix", "AZ", "850"), ("Atlanta", "GA", "303"),
    ("Seattle", "WA", "981"), ("Portland", "OR", "972"), ("Chicago", "IL", "606"),
    ("Raleigh", "NC", "276"), ("Nashville", "TN", "372"), ("Tampa", "FL", "336"),
)  # fmt: skip
STREETS: Final = ("Main St", "Oak Ave", "Maple Dr", "Cedar Ln", "Elm St", "Park Blvd", "Pine Ct")
EMAIL_DOMAINS: Final = ("example.com", "mail.example.org", "inbox.example.net")
# Real area codes: the cities' own, and others, as people keep their numbers when they move.
AREA_CODES: Final = (
    "512", "737", "214", "469", "972", "713", "832", "281", "303", "720", "602", "480",
    "404", "678", "206", "425", "503", "971", "312", "773", "919", "984", "615", "629",
    "813", "727", "212", "415", "617", "305", "702", "818",
)  # fmt: skip
# (type, share): a first phone is mostly a mobile; a second may also be a fax.
PHONE_TYPES: Final = (("MOBILE", 14), ("HOME", 4), ("WORK", 2), ("OTHER", 1))
PHONE_2_TYPES: Final = (("MOBILE", 4), ("HOME", 3), ("WORK", 3), ("FAX", 2), ("OTHER", 1))
# As source systems send them: typed by hand into a form, E.164 from an SMS provider,
# bare digits from a CSV export, with or without the country code.
PHONE_FORMATS: Final = (
    "({a}) {b}-{c}", "{a}-{b}-{c}", "{a}.{b}.{c}", "{a}{b}{c}", "+1{a}{b}{c}", "+1 {a}-{b}-{c}",
    "1-{a}-{b}-{c}",
)  # fmt: skip
APPLICANT_TYPES: Final = (("PRIMARY", "Primary"), ("CO_APPLICANT", "Co-Applicant"),
                          ("GUARANTOR", "Guarantor"), ("OCCUPANT", "Occupant"))  # fmt: skip
# An applicant's age in whole years at created_at, and its share: renters are mostly young
# adults, never minors (a minor is an occupant on a lease, not an applicant).
APPLICANT_AGES: Final = (
    tuple((age, 4) for age in range(18, 25)) + tuple((age, 5) for age in range(25, 35))
    + tuple((age, 3) for age in range(35, 45)) + tuple((age, 2) for age in range(45, 55))
    + tuple((age, 1) for age in range(55, 80))
)  # fmt: skip
# (status_raw, status_normalized, status): the source's words, the published normalized
# status they mean, and its lower case. "In Review" is still pending; "Waitlisted" is none
# of the named outcomes.
STATUSES: Final = (("Pending", "PENDING", "pending"), ("Approved", "APPROVED", "approved"),
                   ("Denied", "DENIED", "denied"), ("Cancelled", "CANCELED", "canceled"),
                   ("In Review", "PENDING", "pending"),
                   ("Waitlisted", "OTHER", "other"))  # fmt: skip
APPLICATION_SOURCES: Final = ("web", "walk-in", "phone")
# Pets by type: (type, share in 100 pets, breeds, notes). A breed: (name, share within its
# type, lightest and heaviest adult weight in lb, oldest age in years, colors). Every pet
# is at least a year old, so it weighs what an adult of its breed does.
PET_TYPES: Final = (
    ("dog", 50, (
        ("Mixed", 6, 10, 70, 15, ("black", "brown", "tan", "white", "brindle", "spotted")),
        ("Labrador Retriever", 4, 55, 80, 13, ("black", "yellow", "chocolate")),
        ("Golden Retriever", 2, 55, 75, 12, ("golden", "cream", "red")),
        ("German Shepherd", 2, 50, 90, 11, ("black and tan", "sable", "black")),
        ("Pit Bull Terrier", 2, 35, 65, 14, ("blue", "brindle", "white", "fawn")),
        ("Boxer", 1, 50, 80, 10, ("fawn", "brindle", "white")),
        ("Standard Poodle", 1, 40, 70, 14, ("white", "black", "apricot", "grey")),
        ("Siberian Husky", 1, 35, 60, 13, ("grey and white", "black and white", "red and white")),
        ("Border Collie", 1, 30, 55, 14, ("black and white", "red merle", "blue merle")),
        ("Beagle", 2, 18, 30, 14, ("tricolor", "lemon", "red and white")),
        ("French Bulldog", 2, 16, 28, 11, ("fawn", "brindle", "cream", "blue")),
        ("Boston Terrier", 1, 12, 25, 13, ("black and white", "brindle and white")),
        ("Dachshund", 2, 11, 25, 15, ("red", "black and tan", "dapple")),
        ("Pug", 1, 14, 18, 13, ("fawn", "black")),
        ("Shih Tzu", 2, 9, 16, 15, ("white and gold", "black and white", "brindle")),
        ("Cavalier King Charles Spaniel", 1, 13, 18, 12, ("blenheim", "tricolor", "ruby")),
    ), ("", "Friendly", "Needs a yard", "Crate trained", "House trained")),
    ("cat", 34, (
        ("Domestic Shorthair", 6, 7, 14, 18,
         ("black", "orange tabby", "brown tabby", "grey", "calico", "tuxedo")),
        ("Domestic Longhair", 2, 7, 15, 18, ("black", "grey", "white", "tortoiseshell")),
        ("Siamese", 1, 6, 12, 18, ("seal point", "blue point", "chocolate point")),
        ("Maine Coon", 1, 10, 18, 15, ("brown tabby", "red tabby", "black", "silver")),
        ("Persian", 1, 7, 12, 15, ("white", "cream", "silver", "black")),
        ("Ragdoll", 1, 10, 18, 15, ("seal point", "blue bicolor", "lilac point")),
    ), ("", "Friendly", "Indoor only", "Litter trained")),
    ("bird", 6, (
        ("Parakeet", 4, 0.06, 0.09, 10, ("green", "blue", "yellow")),
        ("Cockatiel", 2, 0.17, 0.26, 20, ("grey", "lutino", "pied")),
        ("Lovebird", 1, 0.09, 0.13, 12, ("green", "peach-faced", "blue")),
        ("Canary", 1, 0.03, 0.06, 10, ("yellow", "orange", "white")),
        ("African Grey", 1, 0.88, 1.43, 40, ("grey",)),
    ), ("", "Caged", "Talks", "Friendly")),
    ("fish", 3, (
        ("Goldfish", 3, 0.05, 0.5, 10, ("orange", "gold", "calico", "white")),
        ("Betta", 2, 0.01, 0.02, 4, ("red", "blue", "purple", "white")),
        ("Angelfish", 1, 0.02, 0.06, 10, ("silver", "black", "marble")),
    ), ("", "10-gallon tank", "20-gallon tank")),
    ("reptile", 3, (
        ("Bearded Dragon", 3, 0.6, 1.2, 12, ("tan", "orange", "yellow")),
        ("Leopard Gecko", 2, 0.1, 0.18, 15, ("yellow", "tangerine", "albino")),
        ("Ball Python", 2, 2.0, 5.0, 25, ("brown", "banana", "piebald")),
        ("Corn Snake", 1, 0.5, 1.8, 15, ("orange", "red", "amelanistic")),
        ("Red-eared Slider", 1, 0.5, 2.5, 25, ("green",)),
    ), ("", "Terrarium", "Heat lamp")),
    ("rabbit", 4, (
        ("Holland Lop", 2, 2.0, 4.0, 10, ("brown", "white", "black", "orange")),
        ("Mini Rex", 1, 3.5, 4.5, 10, ("black", "white", "castor", "blue")),
        ("Lionhead", 1, 2.5, 3.75, 9, ("white", "grey", "tortoiseshell")),
        ("Netherland Dwarf", 1, 1.1, 2.5, 11, ("white", "black", "chestnut")),
    ), ("", "Litter trained", "Free roaming", "Friendly")),
)  # fmt: skip
# Which yes/no fields apply to which type, and how many in 100 of those not null are
# yes. None: never asked of the type, so always null (a fish is neither declawed nor
# vaccinated, and in the ADA's sense only a dog is a service animal).
#              declawed, fixed, service, trained, vaccinated
PET_FLAGS: Final = {
    "dog": (None, 80, 8, 75, 92),
    "cat": (20, 88, None, 90, 85),
    "bird": (None, None, None, 30, None),
    "fish": (None, None, None, None, None),
    "reptile": (None, None, None, None, None),
    "rabbit": (None, 60, None, 55, 35),
}
PET_NAMES: Final = ("Max", "Bella", "Luna", "Charlie", "Milo", "Coco", "Rocky", "Kiwi")
SCREENING_STATUSES: Final = ("Passed", "Failed", "Pending", "Conditional")
INCOME_TYPES: Final = (("EMPLOYMENT", "Employment"), ("SELF_EMPLOYMENT", "Self-employed"),
                       ("BENEFITS", "Benefits"), ("OTHER", "Other"))  # fmt: skip
# Self-reported income, as source systems hold it: an amount with no period, a year's
# or a month's. So that a reader can tell which, a monthly amount is always under
# MONTHLY_BELOW dollars and a yearly one never is. Per income type, in INCOME_TYPES'
# order: (share in 100, monthly, lowest dollars, highest dollars) bands. An applicant's
# first income is the main one; any further one is a side income (part-time work,
# benefits, support), so smaller.
MONTHLY_BELOW: Final = 20_000
PRIMARY_INCOME_BANDS: Final = (
    ((52, False, 20_000, 90_000), (18, False, 90_000, 200_000),
     (25, True, 1_700, 12_500), (5, False, 200_000, 450_000)),
    ((45, False, 20_000, 110_000), (15, False, 110_000, 200_000),
     (32, True, 1_700, 15_000), (8, False, 200_000, 600_000)),
    ((75, True, 850, 3_800), (25, False, 20_000, 48_000)),
    ((60, True, 1_700, 9_000), (40, False, 20_000, 90_000)),
)  # fmt: skip
SECONDARY_INCOME_BANDS: Final = (
    ((65, True, 600, 4_000), (35, False, 20_000, 55_000)),
    ((75, True, 300, 5_000), (25, False, 20_000, 70_000)),
    ((100, True, 300, 2_500),),
    ((100, True, 100, 2_000),),
)  # fmt: skip
NOTES: Final = ("", "Prefers email", "Needs parking", "Relocating for work")
LEAD_SOURCES: Final = ("web", "referral", "ils", "walk-in")
TAGS: Final = ("pets", "parking", "furnished", "corporate")
# How many items a nested array gets: every length from empty up, the short ones most.
APPLICATION_COUNTS: Final = (0, 1, 1, 1, 2, 3)
PET_COUNTS: Final = (0, 0, 0, 1, 1, 2, 4)
SCREENING_COUNTS: Final = (0, 1, 1, 2)
INCOME_COUNTS: Final = (0, 1, 1, 2, 3)

# 2019-01-01 .. 2026-01-01 in microseconds: "timestamps spread over years".
START: Final = 1_546_300_800_000_000
SPAN: Final = 7 * 365 * 86_400_000_000
DAY: Final = 86_400_000_000
QUARTER_DAY: Final = DAY // 4
