"""Writes the answer cache's unseen-word pair sets: ``bench/data/cache_heldout.jsonl`` and
``bench/data/cache_tune.jsonl`` (issue 40).

    .venv/bin/python bench/make_cache_unseen.py [--only heldout|tune]

Hand-made templates and word lists written for kefu (no rows of any data set). Each set holds
about 1,000 pairs, English and Chinese alike, half true paraphrases (``label: "same"``: one answer
serves both; some share few words) and half look-alikes (``label: "different"``) that differ in ONE
content word of a kind the cache's slot vocabulary (``cache_layer/data/slots.json``) does not tell
apart: a product kind, an action and its opposite, a material, a place, a person. A look-alike is
kept only when both questions name the same slot values (so the vocabulary cannot be what refuses
it). The two sets share the recipe, not the words: the held-apart set's word lists and every other
template are its own; the tuning set gets the rest.

Each line: ``{"id", "set", "lang", "kind", "label", "a", "b"}``; ``kind`` is ``product_kind``,
``action``, ``material``, ``place``, ``person`` for look-alikes and ``paraphrase`` or
``paraphrase_few_words`` for paraphrases. The held-apart set is never used to choose a rule or a
threshold (its SHA-256 is in the commit that added it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# --- words: one bank per set ---------------------------------------------------------------------

WORDS: dict[str, dict[str, dict[str, list]]] = {
    "heldout": {
        "en": {
            "product": [
                "nightstand",
                "bookshelf",
                "kettle",
                "blender",
                "toaster",
                "backpack",
                "umbrella",
                "tent",
                "yoga mat",
                "stroller",
                "scarf",
                "suitcase",
                "vacuum cleaner",
                "rice cooker",
                "humidifier",
                "air fryer",
                "skateboard",
                "treadmill",
            ],
            "material": ["oak", "pine", "walnut", "beech", "maple", "cherry", "birch", "acacia"],
            "furniture": ["nightstand", "side table", "coffee table", "dining chair", "bench", "bookshelf"],
            "action": [
                ("subscribe to the newsletter", "unsubscribe from the newsletter"),
                ("earn loyalty points", "redeem loyalty points"),
                ("pause my subscription", "resume my subscription"),
                ("upgrade my plan", "downgrade my plan"),
                ("lock my account", "unlock my account"),
                ("follow the store", "unfollow the store"),
                ("enable two-factor login", "disable two-factor login"),
                ("join the referral programme", "leave the referral programme"),
                ("link my bank card", "unlink my bank card"),
                ("accept a gift", "decline a gift"),
            ],
            "place": ["Lisbon", "Reykjavik", "Nairobi", "Osaka", "Honolulu", "Alaska", "Puerto Rico", "Tasmania"],
            "person": ["toddler", "teenager", "senior", "newborn", "pregnant woman", "beginner", "ten-year-old"],
        },
        "zh": {
            "product": [
                "书架",
                "电水壶",
                "榨汁机",
                "背包",
                "雨伞",
                "帐篷",
                "瑜伽垫",
                "婴儿推车",
                "围巾",
                "行李箱",
                "吸尘器",
                "电饭煲",
                "加湿器",
                "空气炸锅",
                "滑板",
                "跑步机",
            ],
            "material": ["橡木", "松木", "胡桃木", "榉木", "枫木", "樱桃木", "桦木"],
            "furniture": ["书架", "边几", "茶几", "餐椅", "长凳"],
            "action": [
                ("订阅新闻邮件", "退订新闻邮件"),
                ("赚取积分", "兑换积分"),
                ("暂停自动续费", "恢复自动续费"),
                ("升级套餐", "降级套餐"),
                ("锁定账户", "解锁账户"),
                ("关注店铺", "取关店铺"),
                ("绑定银行卡", "解绑银行卡"),
                ("加入推荐计划", "退出推荐计划"),
                ("领取优惠券", "转赠优惠券"),
            ],
            "place": ["北京", "上海", "成都", "拉萨", "乌鲁木齐", "哈尔滨", "三亚", "西宁"],
            "person": ["老人", "小孩", "孕妇", "新生儿", "青少年", "初学者", "十岁孩子"],
        },
    },
    "tune": {
        "en": {
            "product": [
                "dresser",
                "bookcase",
                "coffee grinder",
                "juicer",
                "waffle maker",
                "duffel bag",
                "raincoat",
                "sleeping bag",
                "kayak",
                "pressure cooker",
                "dehumidifier",
                "microwave",
                "bike helmet",
                "paddle board",
                "rowing machine",
                "bassinet",
                "ottoman",
                "projector",
            ],
            "material": ["teak", "ash", "elm", "mango wood", "rattan", "marble", "acrylic", "rosewood"],
            "furniture": ["dresser", "console table", "stool", "headboard", "cabinet", "shelf"],
            "action": [
                ("opt in to marketing texts", "opt out of marketing texts"),
                ("turn on order notifications", "turn off order notifications"),
                ("add an item to my wishlist", "take an item off my wishlist"),
                ("mute the store's messages", "unmute the store's messages"),
                ("sign in on a new phone", "sign out on a new phone"),
                ("rent the carpet cleaner", "buy the carpet cleaner"),
                ("top up my wallet balance", "withdraw my wallet balance"),
                ("block a seller", "unblock a seller"),
                ("claim a voucher", "give away a voucher"),
                ("book an installation visit", "reschedule an installation visit"),
            ],
            "place": ["Madrid", "Oslo", "Cairo", "Perth", "Hawaii", "Guam", "Anchorage", "Sicily"],
            "person": [
                "infant",
                "preschooler",
                "elderly person",
                "student",
                "nursing mother",
                "expert",
                "six-year-old",
            ],
        },
        "zh": {
            "product": [
                "梳妆台",
                "咖啡机",
                "豆浆机",
                "旅行袋",
                "雨衣",
                "睡袋",
                "皮划艇",
                "高压锅",
                "除湿机",
                "微波炉",
                "头盔",
                "划船机",
                "烤箱",
                "电风扇",
                "投影仪",
            ],
            "material": ["柚木", "水曲柳", "芒果木", "藤编", "大理石", "亚克力", "红木", "白蜡木"],
            "furniture": ["梳妆台", "边柜", "凳子", "斗柜", "置物架"],
            "action": [
                ("开启消息通知", "屏蔽消息通知"),
                ("收藏商品", "移出收藏夹"),
                ("登录账号", "退出登录账号"),
                ("充值钱包", "提现钱包余额"),
                ("拉黑卖家", "解除拉黑卖家"),
                ("租用地毯清洗机", "购买地毯清洗机"),
                ("打开短信提醒", "关掉短信提醒"),
                ("预约上门安装", "改约上门安装"),
            ],
            "place": ["广州", "深圳", "重庆", "呼和浩特", "昆明", "大连", "海口", "银川"],
            "person": ["婴儿", "学龄前儿童", "老年人", "学生", "哺乳期妈妈", "专业人士", "六岁孩子"],
        },
    },
}

# --- templates: the held-apart set takes the even ones, the tuning set the odd ones --------------

LOOKALIKE: dict[str, dict[str, list[str]]] = {
    "en": {
        "product_kind": [
            "What is the warranty on the {x}?",
            "Is the {x} in stock right now?",
            "How do I clean the {x}?",
            "Does the {x} need to be assembled?",
            "Can I get spare parts for the {x}?",
            "Is the {x} covered by the free returns offer?",
            "What comes in the box with the {x}?",
            "How heavy is the {x}?",
        ],
        "material": [
            "Is the {x} {f} solid wood?",
            "Does the {x} {f} need oiling?",
            "Will the {x} {f} darken over time?",
            "Is the {x} {f} finish food safe?",
            "Can the {x} {f} go outdoors?",
            "How do I remove a stain from the {x} {f}?",
        ],
        "action": [
            "How do I {x}?",
            "Can I {x} in the app?",
            "Where can I {x}?",
            "Is there a fee to {x}?",
            "Why can't I {x}?",
            "Can customer service {x} for me?",
            "What happens if I {x}?",
            "Can I {x} on the website?",
            "Is it possible to {x} from the checkout page?",
            "How long does it take to {x}?",
        ],
        "place": [
            "Do you deliver to {x}?",
            "Is there a showroom in {x}?",
            "How many days does delivery to {x} take?",
            "do you ship to {x}?",
            "Can I pick up my parcel in {x}?",
            "is there a store in {x}?",
        ],
        "person": [
            "Is this balance bike suitable for a {x}?",
            "Can a {x} use the massage cushion?",
            "Is this helmet safe for a {x}?",
            "Which bicycle would you recommend for a {x}?",
            "Is the yoga course good for a {x}?",
            "Can a {x} sleep on the memory foam topper?",
            "Is the climbing frame safe for a {x}?",
            "Do you have a car seat that fits a {x}?",
        ],
    },
    "zh": {
        "product_kind": [
            "{x}的保修期是多久？",
            "{x}现在有现货吗？",
            "{x}怎么清洗？",
            "{x}需要自己组装吗？",
            "{x}可以单独买配件吗？",
            "{x}支持七天无理由吗？",
            "{x}包装里有什么？",
            "{x}有多重？",
        ],
        "material": [
            "{x}{f}是实木的吗？",
            "{x}{f}需要定期上油吗？",
            "{x}{f}时间长了会变色吗？",
            "{x}{f}的漆环保吗？",
            "{x}{f}可以放在户外吗？",
            "{x}{f}弄脏了怎么清理？",
        ],
        "action": [
            "怎么{x}？",
            "在App里可以{x}吗？",
            "在哪里{x}？",
            "{x}要手续费吗？",
            "为什么我{x}失败了？",
            "客服可以帮我{x}吗？",
            "{x}之后会怎样？",
            "网页版能{x}吗？",
            "结账页面可以直接{x}吗？",
            "{x}多久生效？",
        ],
        "place": [
            "能寄到{x}吗？",
            "{x}有线下体验店吗？",
            "寄到{x}要几天？",
            "{x}可以自提包裹吗？",
            "你们在{x}有仓库吗？",
            "{x}能送货上门吗？",
        ],
        "person": [
            "这款平衡车适合{x}吗？",
            "{x}可以用这个按摩垫吗？",
            "这款头盔{x}戴安全吗？",
            "给{x}推荐哪款自行车？",
            "这个瑜伽课程适合{x}吗？",
            "{x}可以睡记忆棉床垫吗？",
            "攀爬架适合{x}玩吗？",
            "有没有适合{x}的安全座椅？",
        ],
    },
}

# (first, second, what fills {x}, few shared words?)
PARAPHRASE: dict[str, list[tuple[str, str, str, bool]]] = {
    "en": [
        ("What is the warranty on the {x}?", "What warranty comes with the {x}?", "product", False),
        ("Is the {x} in stock right now?", "Do you currently have the {x} available?", "product", False),
        ("How do I clean the {x}?", "What's the right way to clean the {x}?", "product", False),
        ("Does the {x} need to be assembled?", "Will the {x} arrive already put together?", "product", True),
        ("How heavy is the {x}?", "What does the {x} weigh?", "product", True),
        ("What are the dimensions of the {x}?", "How big is the {x}?", "product", True),
        ("Can I get spare parts for the {x}?", "Do you sell replacement parts for the {x}?", "product", False),
        ("What comes in the box with the {x}?", "What is included with the {x}?", "product", True),
        ("Is the {x} solid wood?", "Is the {x} made of real solid wood?", "material_f", False),
        ("Does the {x} need oiling?", "Should I oil the {x} regularly?", "material_f", False),
        ("How do I {x}?", "What are the steps to {x}?", "action", False),
        ("Can I {x} in the app?", "Is it possible to {x} using the app?", "action", False),
        ("Do you deliver to {x}?", "Can you ship orders to {x}?", "place", False),
        ("Is there a showroom in {x}?", "Can I see your products in person in {x}?", "place", True),
        ("Is this helmet safe for a {x}?", "Would this helmet protect a {x} properly?", "person", True),
        ("Can a {x} use the massage cushion?", "Is the massage cushion okay for a {x} to use?", "person", False),
        ("Does the {x} have a warranty?", "Is there any guarantee on the {x}?", "product", False),
        ("Is the {x} easy to clean?", "Is it simple to keep the {x} clean?", "product", False),
        ("How long will the {x} last?", "What is the lifespan of the {x}?", "product", True),
        ("Where is the {x} made?", "Which country manufactures the {x}?", "product", True),
        ("Is the {x} sturdy?", "Is the {x} solidly built?", "material_f", False),
        ("Will the {x} scratch easily?", "Does the {x} get scratched easily?", "material_f", False),
        ("Is it free to {x}?", "Does it cost anything to {x}?", "action", True),
        ("Where in my account settings can I {x}?", "Which account setting lets me {x}?", "action", False),
        ("Do you have a pickup point in {x}?", "Is there somewhere in {x} where I can collect orders?", "place", True),
        ("Do you ship to {x}?", "Can I order to an address in {x}?", "place", True),
        ("Is the balance bike suitable for a {x}?", "Would the balance bike work for a {x}?", "person", False),
        ("Which bicycle would you recommend for a {x}?", "What bike do you suggest for a {x}?", "person", False),
    ],
    "zh": [
        ("{x}的保修期是多久？", "{x}保修多长时间？", "product", False),
        ("{x}现在有现货吗？", "{x}现在有货吗？", "product", False),
        ("{x}怎么清洗？", "{x}应该如何清洁？", "product", False),
        ("{x}需要自己组装吗？", "{x}到手是装好的吗？", "product", True),
        ("{x}有多重？", "{x}的重量是多少？", "product", False),
        ("{x}的尺寸是多少？", "{x}有多大？", "product", True),
        ("{x}可以单独买配件吗？", "{x}的配件单独卖吗？", "product", False),
        ("{x}包装里有什么？", "买{x}送哪些东西？", "product", True),
        ("{x}是实木的吗？", "{x}是不是纯实木做的？", "material_f", False),
        ("{x}需要定期上油吗？", "{x}要经常打蜡保养吗？", "material_f", True),
        ("怎么{x}？", "{x}的步骤是什么？", "action", False),
        ("在App里可以{x}吗？", "用手机App能{x}吗？", "action", False),
        ("能寄到{x}吗？", "你们发货到{x}吗？", "place", False),
        ("{x}有线下体验店吗？", "在{x}能去实体店看看吗？", "place", True),
        ("这款头盔{x}戴安全吗？", "{x}戴这款头盔有保障吗？", "person", True),
        ("{x}可以用这个按摩垫吗？", "这个按摩垫{x}能用吗？", "person", False),
        ("{x}有质保吗？", "{x}保不保修？", "product", False),
        ("{x}好清洗吗？", "{x}清洁起来方便吗？", "product", False),
        ("{x}能用多少年？", "{x}的使用寿命是多长？", "product", True),
        ("{x}是哪里生产的？", "{x}的产地是哪儿？", "product", True),
        ("{x}结实吗？", "{x}做工牢固吗？", "material_f", False),
        ("{x}容易刮花吗？", "{x}表面会不会很容易划伤？", "material_f", False),
        ("{x}免费吗？", "{x}要花钱吗？", "action", True),
        ("在账户设置哪里{x}？", "账户设置里哪个选项可以{x}？", "action", False),
        ("{x}有自提点吗？", "在{x}哪里可以自己取货？", "place", True),
        ("可以发货到{x}吗？", "收货地址填{x}能下单吗？", "place", True),
        ("这款平衡车适合{x}吗？", "{x}骑这款平衡车合适吗？", "person", False),
        ("给{x}推荐哪款自行车？", "{x}骑什么自行车比较好？", "person", False),
    ],
}

PAIRS_PER_KIND = 50  # look-alikes per kind and language: 5 kinds x 50 = 250, and 250 paraphrases


def _fill(template: str, x: str, f: str = "") -> str:
    return template.replace("{x}", x).replace("{f}", f)


def build(name: str, seed: int) -> list[dict]:
    """The pairs of set ``name`` (``"heldout"`` or ``"tune"``), deterministic for ``seed``."""
    from cache_layer.slots import slot_values

    rng = random.Random(seed)
    parity = 0 if name == "heldout" else 1
    rows: list[dict] = []
    for lang in ("en", "zh"):
        words = WORDS[name][lang]
        sep = " " if lang == "en" else ""
        for kind, templates in LOOKALIKE[lang].items():
            mine = templates[parity::2]
            seen: set[tuple[str, str]] = set()
            tries = 0
            while len(seen) < PAIRS_PER_KIND and tries < 5000:
                tries += 1
                t = rng.choice(mine)
                f = ""
                if kind == "action":
                    x1, x2 = rng.choice(words["action"])
                    if rng.random() < 0.5:
                        x1, x2 = x2, x1
                else:
                    pool = words["product" if kind == "product_kind" else kind]
                    x1, x2 = rng.sample(pool, 2)
                    if kind == "material":
                        f = rng.choice(words["furniture"])
                a, b = _fill(t, x1, f), _fill(t, x2, f)
                if kind == "place" and t[0].islower():
                    a, b = a.lower(), b.lower()
                # Kept only when the vocabulary cannot tell them apart.
                if slot_values(a) != slot_values(b) or (a, b) in seen or (b, a) in seen:
                    continue
                seen.add((a, b))
                rows.append({"lang": lang, "kind": kind, "label": "different", "a": a, "b": b})
        mine_p = PARAPHRASE[lang][parity::2]
        seen = set()
        tries = 0
        while len(seen) < 5 * PAIRS_PER_KIND and tries < 20000:
            tries += 1
            t1, t2, fill, few = rng.choice(mine_p)
            if fill == "material_f":
                x = rng.choice(words["material"]) + sep + rng.choice(words["furniture"])
            elif fill == "action":
                x = rng.choice(rng.choice(words["action"]))
            else:
                x = rng.choice(words[fill])
            a, b = _fill(t1, x), _fill(t2, x)
            if rng.random() < 0.5:
                a, b = b, a
            if (a, b) in seen or (b, a) in seen:
                continue
            seen.add((a, b))
            kind = "paraphrase_few_words" if few else "paraphrase"
            rows.append({"lang": lang, "kind": kind, "label": "same", "a": a, "b": b})
    rng.shuffle(rows)
    return [{"id": f"{name}-{i:04d}", "set": name, **r} for i, r in enumerate(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["heldout", "tune"])
    args = parser.parse_args()
    for name, seed in (("heldout", 4040), ("tune", 4041)):
        if args.only and args.only != name:
            continue
        rows = build(name, seed)
        path = ROOT / "bench" / "data" / f"cache_{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        kinds: dict[str, int] = {}
        for r in rows:
            kinds[f"{r['lang']}.{r['kind']}"] = kinds.get(f"{r['lang']}.{r['kind']}", 0) + 1
        print(path.name, len(rows), dict(sorted(kinds.items())))


if __name__ == "__main__":
    main()
